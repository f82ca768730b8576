"""The only package that imports the Kafka client (confluent-kafka)."""
