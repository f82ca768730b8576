"""Operability (floor 3): Prometheus metrics, OpenTelemetry traces and structured logs.

``metrics`` defines every metric, ``tracing`` the spans and the trace context carried in
Kafka headers, ``logs`` the log fields and the JSON format, and ``telemetry`` the one
object per turn that the spine calls.
"""
