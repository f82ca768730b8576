"""Local servers that speak the model providers' wire formats (floor 9, a face).

The tests drive the adapters through the official SDKs against them, and the bench
measures against them (it cannot import ``tests/``): no network, and usage reported by
each provider's rules.
"""
