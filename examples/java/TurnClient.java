// A turn from Java, straight to Kafka: no pyrula-stream code on this side.
//
// Produces one turn request (the JSON form of schemas/json/turn_request.schema.json) to
// <prefix>.<agent>.turns and reads that turn's events (schemas/json/event.schema.json)
// from <prefix>.<agent>.events until run:complete or run:error. The agent writes its
// events as JSON: @kafka_agent(..., event_format="json").
//
//   java -cp "$KAFKA_LIBS/*" TurnClient.java BOOTSTRAP AGENT '{"question": "Where is order 9?"}'
//
// KAFKA_LIBS holds kafka-clients and jackson-databind (pom.xml beside this file lists
// them). Exit code 0 when the turn completed, 1 when it failed, 2 on a timeout.
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import java.util.UUID;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TurnClient {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: TurnClient BOOTSTRAP AGENT PARAMS_JSON [PREFIX]");
            System.exit(64);
        }
        String bootstrap = args[0], agent = args[1];
        String prefix = args.length > 3 ? args[3] : "pyrula";
        ObjectMapper json = new ObjectMapper();
        String turnId = UUID.randomUUID().toString().replace("-", "");

        Properties read = new Properties();
        read.put("bootstrap.servers", bootstrap);
        read.put("isolation.level", "read_committed"); // only events of committed steps
        read.put("enable.auto.commit", "false");
        try (KafkaConsumer<String, String> events =
                new KafkaConsumer<>(read, new StringDeserializer(), new StringDeserializer())) {
            // Start at the end of every partition before the request exists: the turn's
            // events all come after it. (Its partition is murmur2 of the turn id, as
            // Kafka's default partitioner computes, so one partition would do.)
            String eventsTopic = prefix + "." + agent + ".events";
            List<TopicPartition> parts = events.partitionsFor(eventsTopic).stream()
                    .map(p -> new TopicPartition(eventsTopic, p.partition())).toList();
            events.assign(parts);
            events.seekToEnd(parts);
            parts.forEach(events::position);

            ObjectNode request = json.createObjectNode();
            request.put("turn_id", turnId);
            request.put("agent", agent);
            request.set("params", json.readTree(args[2]));
            Properties write = new Properties();
            write.put("bootstrap.servers", bootstrap);
            write.put("acks", "all");
            try (KafkaProducer<String, String> producer =
                    new KafkaProducer<>(write, new StringSerializer(), new StringSerializer())) {
                ProducerRecord<String, String> record = new ProducerRecord<>(
                        prefix + "." + agent + ".turns", turnId, json.writeValueAsString(request));
                record.headers().add("content-type", "application/json".getBytes(StandardCharsets.UTF_8));
                producer.send(record).get();
            }
            System.out.println("submitted " + turnId);

            long deadline = System.currentTimeMillis() + 60_000;
            while (System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : events.poll(Duration.ofMillis(200))) {
                    if (!turnId.equals(r.key())) {
                        continue;
                    }
                    JsonNode event = json.readTree(r.value());
                    String type = event.get("type").asText();
                    System.out.println(event.get("seq").asLong() + " " + type + " " + event.get("data"));
                    if (type.equals("run:complete")) {
                        System.exit(0);
                    }
                    if (type.equals("run:error")) {
                        System.exit(1);
                    }
                }
            }
            System.err.println("no run:complete or run:error within 60 s");
            System.exit(2);
        }
    }
}
