"""A real Apache Kafka on this machine, for development and tests (floor 3): ``broker``
(one KRaft node from Maven Central's jars), ``cluster`` (three of them) and
``registry`` (a schema registry speaking Confluent's REST API). Never a mock."""
