package dev.windowsidecar.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import dev.windowsidecar.v1.Mode;
import dev.windowsidecar.v1.Open;
import java.time.Duration;
import java.util.List;
import org.junit.Test;

/** The {@code open} message each kind of options becomes. */
public class SubscribeOptionsTest {
  @Test
  public void streamWithDeadLetterAndAtomicMode() {
    Open open =
        SubscribeOptions.builder("orders", "svc")
            .consumer("w1")
            .count(8)
            .deadLetter(2, "orders-dead")
            .atomic(true)
            .build()
            .toOpen();
    assertEquals("orders", open.getStream().getKey());
    assertEquals("svc", open.getStream().getGroup());
    assertEquals("w1", open.getStream().getConsumer());
    assertEquals(8, open.getCount());
    assertEquals(2, open.getMaxDeliveries());
    assertEquals("orders-dead", open.getDeadLetter().getStream());
    assertEquals(Mode.MODE_ATOMIC, open.getMode());
  }

  @Test
  public void pipelineAndNoCapByDefault() {
    Open open = SubscribeOptions.builder("orders", "svc").build().toOpen();
    assertEquals(Mode.MODE_PIPELINE, open.getMode());
    assertEquals(0, open.getMaxDeliveries());
    assertFalse(open.hasDeadLetter());
    assertFalse(open.getReportsInReads());
  }

  @Test
  public void framingAndPubsubBuffer() {
    Open open =
        SubscribeOptions.pubsub()
            .channels("news")
            .pubsubBuffer(50)
            .framing(dev.windowsidecar.v1.Framing.FRAMING_RAW)
            .build()
            .toOpen();
    assertEquals(50, open.getPubsub().getBuffer());
    assertEquals(dev.windowsidecar.v1.Framing.FRAMING_RAW, open.getFraming());
    assertEquals(
        dev.windowsidecar.v1.Framing.FRAMING_UNSPECIFIED,
        SubscribeOptions.simpleList("l").build().toOpen().getFraming());
  }

  @Test
  public void anOrderingKeyByHeaderOrByFieldNeverBoth() {
    assertFalse(SubscribeOptions.builder("orders", "svc").build().toOpen().hasOrderingKey());
    Open header = SubscribeOptions.builder("orders", "svc").orderingHeader("customer").build().toOpen();
    assertEquals("customer", header.getOrderingKey().getHeader());
    Open field = SubscribeOptions.builder("orders", "svc").orderingField("customer_id").build().toOpen();
    assertEquals("customer_id", field.getOrderingKey().getField());
    Open list = SubscribeOptions.reliableList("jobs").orderingHeader("customer").build().toOpen();
    assertEquals("customer", list.getOrderingKey().getHeader());
    assertThrows(
        IllegalArgumentException.class,
        () -> SubscribeOptions.builder("orders", "svc").orderingHeader("a").orderingField("b").build());
  }

  @Test
  public void aPartitionedStreamOpensWithItsNumber() {
    assertEquals(0, SubscribeOptions.builder("orders", "svc").build().toOpen().getStream().getPartitions());
    SubscribeOptions o =
        SubscribeOptions.builder("orders", "svc")
            .consumer("w1")
            .orderingHeader("customer")
            .partitions(8)
            .build();
    Open open = o.toOpen();
    assertEquals("orders", open.getStream().getKey());
    assertEquals("w1", open.getStream().getConsumer());
    assertEquals(8, open.getStream().getPartitions());
    assertEquals("customer", open.getOrderingKey().getHeader());
    assertEquals("orders/svc (8 partitions)", o.describe());
    assertEquals(
        0, SubscribeOptions.builder("orders", "svc").partitions(0).build().toOpen().getStream().getPartitions());
  }

  @Test
  public void partitionsAreAStreamsAndNeverNegative() {
    IllegalArgumentException negative =
        assertThrows(
            IllegalArgumentException.class, () -> SubscribeOptions.builder("orders", "svc").partitions(-1));
    assertTrue(negative.getMessage(), negative.getMessage().contains("got -1"));
    for (SubscribeOptions.Builder b :
        List.of(
            SubscribeOptions.reliableList("jobs"),
            SubscribeOptions.simpleList("jobs"),
            SubscribeOptions.pubsub().channels("news"))) {
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> b.partitions(4));
      assertTrue(e.getMessage(), e.getMessage().contains("SubscribeOptions.builder(stream, group)"));
    }
  }

  @Test
  public void reportsInReadsAndPackedAcks() {
    SubscribeOptions o =
        SubscribeOptions.builder("orders", "svc").reportsInReads(true).packedAcks(true).build();
    assertTrue(o.toOpen().getReportsInReads());
    assertTrue(o.packedAcks);
  }

  @Test
  public void listsTakeAListDeadLetter() {
    Open reliable =
        SubscribeOptions.reliableList("jobs")
            .consumer("w1")
            .deadAfter(Duration.ofSeconds(10))
            .deadLetter(3, "jobs-dead")
            .build()
            .toOpen();
    assertEquals("jobs", reliable.getReliableList().getKey());
    assertEquals("w1", reliable.getReliableList().getConsumer());
    assertEquals(10, reliable.getReliableList().getDeadAfter().getSeconds());
    assertEquals("jobs-dead", reliable.getDeadLetter().getList());
    Open simple = SubscribeOptions.simpleList("jobs").build().toOpen();
    assertEquals("jobs", simple.getSimpleList().getKey());
  }

  @Test
  public void pubsubNeedsAChannelOrAPattern() {
    Open open = SubscribeOptions.pubsub().channels("news").patterns("ev.*").build().toOpen();
    assertTrue(open.hasPubsub());
    assertEquals(List.of("news"), open.getPubsub().getChannelsList());
    assertEquals(List.of("ev.*"), open.getPubsub().getPatternsList());
    assertThrows(IllegalArgumentException.class, () -> SubscribeOptions.pubsub().build());
  }

  @Test
  public void aDeadLetterNeedsACapAndAKey() {
    SubscribeOptions.Builder b = SubscribeOptions.builder("orders", "svc");
    assertThrows(IllegalArgumentException.class, () -> b.deadLetter(0, "dead"));
    assertThrows(IllegalArgumentException.class, () -> b.deadLetter(2, ""));
  }
}
