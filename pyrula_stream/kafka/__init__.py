"""Kafka (floor 3): the only package that imports the Kafka client (confluent-kafka).

``local/`` starts a real broker, cluster and registry for development (floor 3 too);
``stores/`` holds the Kafka stores of what floor 4 declares, and stands on floor 4."""
