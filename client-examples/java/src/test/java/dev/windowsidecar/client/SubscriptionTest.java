package dev.windowsidecar.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNotSame;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import dev.windowsidecar.v1.Batch;
import dev.windowsidecar.v1.FlushReport;
import dev.windowsidecar.v1.Open;
import dev.windowsidecar.v1.Opened;
import dev.windowsidecar.v1.OutcomeKind;
import dev.windowsidecar.v1.Read;
import dev.windowsidecar.v1.Rejection;
import dev.windowsidecar.v1.RejectionReason;
import dev.windowsidecar.v1.Rejections;
import dev.windowsidecar.v1.RequeueRefusal;
import dev.windowsidecar.v1.SideEffectFailure;
import dev.windowsidecar.v1.SubscribeRequest;
import dev.windowsidecar.v1.SubscribeResponse;
import dev.windowsidecar.v1.WindowServiceGrpc;
import com.google.protobuf.ByteString;
import io.grpc.ManagedChannel;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.List;
import java.util.OptionalInt;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.junit.After;
import org.junit.BeforeClass;
import org.junit.Test;

/** The helper against a scripted in-process sidecar. */
public class SubscriptionTest {
  private static final Object END = new Object();

  /** What one Subscribe stream of the fake sidecar does after the client's `open`. */
  interface Script {
    void run(StreamObserver<SubscribeResponse> out, Inbox in) throws Exception;
  }

  /** The client's messages on one stream. */
  static final class Inbox {
    final LinkedBlockingQueue<Object> queue = new LinkedBlockingQueue<>();

    /** The next batch, or null when the client half-closed or went away. */
    Batch next() throws InterruptedException {
      Object m = queue.poll(5, TimeUnit.SECONDS);
      if (m == null) {
        throw new AssertionError("no message from the client");
      }
      return m == END ? null : ((SubscribeRequest) m).getBatch();
    }

    void awaitEnd() throws InterruptedException {
      while (next() != null) {}
    }
  }

  private Server server;
  private ManagedChannel channel;
  private final AtomicInteger attempts = new AtomicInteger();
  /** The {@code open} of each stream, in order. */
  private final LinkedBlockingQueue<Open> opens = new LinkedBlockingQueue<>();
  private final AtomicReference<Throwable> scriptFailure = new AtomicReference<>();

  @BeforeClass
  public static void quiet() {
    Logger.getLogger("dev.windowsidecar.client").setLevel(Level.OFF);
  }

  private WindowClient start(Script... scripts) throws Exception {
    String name = InProcessServerBuilder.generateName();
    WindowServiceGrpc.WindowServiceImplBase fake =
        new WindowServiceGrpc.WindowServiceImplBase() {
          @Override
          public StreamObserver<SubscribeRequest> subscribe(StreamObserver<SubscribeResponse> out) {
            int n = attempts.getAndIncrement();
            Inbox in = new Inbox();
            Thread t =
                new Thread(
                    () -> {
                      try {
                        Object first = in.queue.take();
                        assertTrue("first message is open", ((SubscribeRequest) first).hasOpen());
                        opens.add(((SubscribeRequest) first).getOpen());
                        if (n < scripts.length) {
                          scripts[n].run(out, in);
                        } else {
                          out.onError(Status.UNAVAILABLE.withDescription("no script").asException());
                        }
                      } catch (Throwable e) {
                        scriptFailure.compareAndSet(null, e);
                        out.onError(Status.INTERNAL.withDescription(e.toString()).asException());
                      }
                    });
            t.setDaemon(true);
            t.start();
            return new StreamObserver<>() {
              @Override
              public void onNext(SubscribeRequest m) {
                in.queue.add(m);
              }

              @Override
              public void onError(Throwable e) {
                in.queue.add(END);
              }

              @Override
              public void onCompleted() {
                in.queue.add(END);
              }
            };
          }
        };
    server = InProcessServerBuilder.forName(name).addService(fake).build().start();
    channel = InProcessChannelBuilder.forName(name).build();
    return WindowClient.of(channel);
  }

  @After
  public void stop() throws Exception {
    if (channel != null) {
      channel.shutdownNow();
      server.shutdownNow();
    }
    if (scriptFailure.get() != null) {
      throw new AssertionError("the fake sidecar failed", scriptFailure.get());
    }
  }

  static SubscribeResponse opened() {
    return opened(0);
  }

  /** {@link #opened()} with {@code Opened.partitions}: the partitions the sidecar shares out. */
  static SubscribeResponse opened(int partitions) {
    return SubscribeResponse.newBuilder()
        .setOpened(
            Opened.newBuilder()
                .setConsumer("c")
                .setCount(16)
                .setMaxInFlight(32)
                .setPartitions(partitions))
        .build();
  }

  static SubscribeResponse read(long id, long firstSlot, String... entries) {
    Read.Builder r = Read.newBuilder().setReadId(id);
    for (int i = 0; i < entries.length; i++) {
      r.addDeliveries(
          dev.windowsidecar.v1.Delivery.newBuilder()
              .setSlot(firstSlot + i)
              .setEntryId(entries[i])
              .setPayload(ByteString.copyFromUtf8(entries[i]))
              .setDeliveryCount(1));
    }
    return SubscribeResponse.newBuilder().setRead(r).build();
  }

  /** {@code read} as a read of a partitioned stream's {@code partition}. */
  static SubscribeResponse inPartition(int partition, SubscribeResponse read) {
    return read.toBuilder().setRead(read.getRead().toBuilder().setPartition(partition)).build();
  }

  static SubscribeResponse flushed(long id, int settles) {
    return SubscribeResponse.newBuilder()
        .setFlush(FlushReport.newBuilder().setReadId(id).setSettles(settles).setOk(true))
        .build();
  }

  /**
   * A fake sidecar's stream that opens, sends {@code read}, answers the client's n-th batch with
   * {@code answers[n]} while there is one, and keeps every batch in {@code got} until the client
   * half-closes.
   */
  static Script answering(
      LinkedBlockingQueue<Batch> got, SubscribeResponse read, SubscribeResponse... answers) {
    return (out, in) -> {
      out.onNext(opened());
      out.onNext(read);
      for (SubscribeResponse answer : answers) {
        got.add(in.next());
        out.onNext(answer);
      }
      for (Batch b = in.next(); b != null; b = in.next()) {
        got.add(b);
      }
      out.onCompleted();
    };
  }

  static SubscribeOptions.Builder options() {
    return SubscribeOptions.builder("s", "g").count(16).backoff(Duration.ofMillis(10), Duration.ofMillis(20));
  }

  /** A handler that leaves its deliveries to the test thread to settle. */
  static DeliveryHandler later(LinkedBlockingQueue<Delivery> ds) {
    return d -> ds.add(d.settleLater());
  }

  static Delivery take(LinkedBlockingQueue<Delivery> q) throws InterruptedException {
    Delivery d = q.poll(5, TimeUnit.SECONDS);
    assertNotNull("no delivery", d);
    return d;
  }

  /** One batch per read, when its last delivery is settled: commands, then outcomes in order. */
  @Test
  public void oneBatchPerRead() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client = start(answering(got, read(1, 1, "1-0", "2-0", "3-0"), flushed(1, 3)));
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Flush> flushes = new LinkedBlockingQueue<>();
    try (Subscription sub = client.subscribe(options().onFlush(flushes::add).build(), later(ds))) {
      assertFalse(sub.isTerminated());
      Delivery d1 = take(ds);
      Delivery d2 = take(ds);
      Delivery d3 = take(ds);
      assertTrue(d2.queue("INCR", "k", 5).ack());
      d1.queue("INCR", "dropped");
      assertTrue(d1.drop("bad"));
      assertNull("a batch before the read was settled", got.poll(100, TimeUnit.MILLISECONDS));
      assertTrue(d3.retryAfter(Duration.ofSeconds(1)));
      assertThrows(AlreadySettledException.class, d3::ack);
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(1, b.getCommandsCount());
      assertEquals(2, b.getCommands(0).getSlot());
      assertEquals("5", b.getCommands(0).getArgs(1).toStringUtf8());
      assertEquals(3, b.getOutcomesCount());
      assertEquals(2, b.getOutcomes(0).getSlot());
      assertEquals(1, b.getOutcomes(1).getSlot());
      assertEquals(3, b.getOutcomes(2).getSlot());
      assertEquals(1000, b.getOutcomes(2).getDelay().getSeconds() * 1000);
      Flush f = flushes.poll(5, TimeUnit.SECONDS);
      assertNotNull(f);
      assertEquals(3, f.settled().size());
      assertEquals(OutcomeKind.OUTCOME_KIND_ACK, f.settled().get(0).outcome());
    }
  }

  /**
   * A read at a time: each read handed out whole to the batch handler, a delivery settled on its
   * own and the rest with one call; a batch handler that throws has every delivery still without
   * an outcome retried after the delay with the reason, none acked.
   */
  @Test
  public void aReadAtATime() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "1-0", "2-0", "3-0"));
              out.onNext(read(2, 4, "4-0", "5-0"));
              int outcomes = 0;
              while (outcomes < 5) {
                Batch b = in.next();
                got.add(b);
                outcomes += b.getOutcomesCount();
              }
              out.onNext(flushed(1, 3));
              out.onNext(flushed(2, 2));
              in.awaitEnd();
              out.onCompleted();
            });
    LinkedBlockingQueue<String> seen = new LinkedBlockingQueue<>();
    BatchHandler handler =
        batch -> {
          seen.add(batch.readId() + ":" + batch.size() + ":" + batch.unsettled().size());
          if (batch.readId() == 2) {
            throw new IllegalStateException("no stock");
          }
          batch.deliveries().get(1).drop("bad");
          batch.deliveries().get(0).queue("INCR", "n");
          assertEquals(2, batch.unsettled().size());
          assertTrue(batch.ack());
          assertEquals(0, batch.unsettled().size());
        };
    try (Subscription sub = client.subscribeBatches(options().build(), handler)) {
      assertFalse(sub.isTerminated());
      assertEquals("1:3:3", seen.poll(5, TimeUnit.SECONDS));
      assertEquals("2:2:2", seen.poll(5, TimeUnit.SECONDS));
      List<String> outcomes = new java.util.ArrayList<>();
      int commands = 0;
      while (outcomes.size() < 5) {
        Batch b = got.poll(5, TimeUnit.SECONDS);
        assertNotNull("no batch", b);
        commands += b.getCommandsCount();
        for (var o : b.getOutcomesList()) {
          outcomes.add(o.getSlot() + " " + o.getKind() + " " + o.getReason());
        }
      }
      assertEquals(1, commands);
      assertEquals("2 OUTCOME_KIND_DROP bad", outcomes.get(0));
      assertEquals("1 OUTCOME_KIND_ACK ", outcomes.get(1));
      assertEquals("3 OUTCOME_KIND_ACK ", outcomes.get(2));
      for (String o : outcomes.subList(3, 5)) {
        assertTrue(o, o.contains("OUTCOME_KIND_RETRY_AFTER handler failed: "));
        assertTrue(o, o.contains("no stock"));
      }
    }
  }

  /**
   * A fake sidecar's stream that opens with {@code Opened.partitions} {@code shared}, sends a read
   * of partition 3 (slots 1 and 2), then a read without a partition, as an unpartitioned stream's
   * (slot 3, whose entry id 5-0 the first read has too), and serves until the client half-closes.
   */
  static Script partitionedReads(int shared) {
    return (out, in) -> {
      out.onNext(opened(shared));
      out.onNext(inPartition(3, read(1, 1, "5-0", "6-0")));
      out.onNext(read(2, 3, "5-0"));
      in.awaitEnd();
      out.onCompleted();
    };
  }

  /** A partition as the tests compare it: its number, or "none". */
  static String partitionOf(OptionalInt partition) {
    return partition.isPresent() ? String.valueOf(partition.getAsInt()) : "none";
  }

  /**
   * The subscription's partitions are {@code Opened.partitions} once it is open (a sidecar that
   * leaves them 0, as an older one does, reads unpartitioned); each delivery's partition is its
   * read's, none for a read without one.
   */
  @Test
  public void eachDeliveryNamesItsPartition() throws Exception {
    WindowClient client = start(partitionedReads(4), partitionedReads(0));
    for (int shared : new int[] {4, 0}) {
      LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
      List<String> seen = new java.util.ArrayList<>();
      int partitions;
      try (Subscription sub = client.subscribe(options().partitions(4).build(), later(ds))) {
        for (int i = 0; i < 3; i++) {
          Delivery d = take(ds);
          seen.add(d.slot() + ":" + partitionOf(d.partition()));
          assertTrue(d.ack());
        }
        partitions = sub.partitions();
      }
      assertEquals(shared, partitions);
      assertEquals(List.of("1:3", "2:3", "3:none"), seen);
    }
  }

  /** A batch's partition is its read's, as its deliveries' are; none for a read without one. */
  @Test
  public void eachBatchNamesItsPartition() throws Exception {
    WindowClient client = start(partitionedReads(4));
    LinkedBlockingQueue<String> seen = new LinkedBlockingQueue<>();
    BatchHandler handler =
        batch -> {
          StringBuilder s =
              new StringBuilder(batch.readId() + ":" + partitionOf(batch.partition()));
          for (Delivery d : batch) {
            s.append(' ').append(partitionOf(d.partition()));
          }
          seen.add(s.toString());
          assertTrue(batch.ack());
        };
    try (Subscription sub = client.subscribeBatches(options().partitions(4).build(), handler)) {
      assertEquals("1:3 3 3", seen.poll(5, TimeUnit.SECONDS));
      assertEquals("2:none none", seen.poll(5, TimeUnit.SECONDS));
      assertEquals(4, sub.partitions());
    }
  }

  /**
   * Ordered: each outcome goes out as it is given (a key's next entry waits in the sidecar for its
   * flush), and a read flushed in parts keeps its unsettled deliveries: the outcome given after the
   * first report goes out too, and the second report covers it.
   */
  @Test
  public void anOrderedReadFlushedInParts() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client =
        start(answering(got, read(1, 1, "1-0", "2-0"), flushed(1, 1), flushed(1, 1)));
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Flush> flushes = new LinkedBlockingQueue<>();
    try (Subscription sub =
        client.subscribe(options().orderingHeader("k").onFlush(flushes::add).build(), later(ds))) {
      assertFalse(sub.isTerminated());
      Delivery slow = take(ds);
      Delivery fast = take(ds);
      assertTrue(fast.ack());
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(1, b.getOutcomesCount());
      assertEquals(2, b.getOutcomes(0).getSlot());
      Flush f = flushes.poll(5, TimeUnit.SECONDS);
      assertNotNull(f);
      assertEquals(List.of(fast), f.settled());
      assertTrue("the rest of a read flushed in part", slow.ack());
      b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(1, b.getOutcomesCount());
      assertEquals(1, b.getOutcomes(0).getSlot());
      f = flushes.poll(5, TimeUnit.SECONDS);
      assertNotNull(f);
      assertEquals(List.of(slow), f.settled());
    }
  }

  /**
   * A partitioned stream: the open carries the number, and the partitions this replica reads
   * share the one stream, each numbering its reads and slots from a range of its own (the
   * sidecar's are 2^36 apart), the same entry id in two of them being two entries. Outcomes name
   * their slots, each report settles its own read's, and an outcome that came after its
   * partition was handed over is refused ALREADY_SETTLED: the listener hears of it, and nothing
   * settles it again (the partition's new reader has the entry).
   */
  @Test
  public void partitionsShareOneStream() throws Exception {
    long p1 = 1L << 36;
    long p2 = 2L << 36;
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(p1 + 1, p1 + 1, "1-0", "2-0"));
              out.onNext(read(p2 + 1, p2 + 1, "1-0"));
              got.add(in.next());
              out.onNext(flushed(p2 + 1, 1));
              got.add(in.next());
              out.onNext(flushed(p1 + 1, 1));
              got.add(in.next());
              out.onNext(alreadySettled(p1 + 2));
              for (Batch b = in.next(); b != null; b = in.next()) {
                got.add(b);
              }
              out.onCompleted();
            });
    LinkedBlockingQueue<WindowException> errors = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Flush> flushes = new LinkedBlockingQueue<>();
    SubscribeOptions o =
        options().orderingHeader("k").partitions(4).listener(errorsTo(errors)).onFlush(flushes::add).build();
    try (Subscription sub = client.subscribe(o, later(ds))) {
      assertFalse(sub.isTerminated());
      Open open = opens.poll(5, TimeUnit.SECONDS);
      assertNotNull(open);
      assertEquals(4, open.getStream().getPartitions());
      assertEquals("s", open.getStream().getKey());
      Delivery a1 = take(ds);
      Delivery a2 = take(ds);
      Delivery b1 = take(ds);
      assertEquals(p2 + 1, b1.slot());
      assertEquals(a1.entryId(), b1.entryId());
      assertTrue(b1.ack());
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(p2 + 1, b.getOutcomes(0).getSlot());
      Flush f = flushes.poll(5, TimeUnit.SECONDS);
      assertNotNull(f);
      assertEquals(List.of(b1), f.settled());
      assertTrue(a1.ack());
      b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(p1 + 1, b.getOutcomes(0).getSlot());
      f = flushes.poll(5, TimeUnit.SECONDS);
      assertNotNull(f);
      assertEquals(List.of(a1), f.settled());
      assertTrue(a2.ack());
      b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(p1 + 2, b.getOutcomes(0).getSlot());
      WindowException e = errors.poll(5, TimeUnit.SECONDS);
      assertTrue(String.valueOf(e), e instanceof RejectedException);
      assertEquals("ALREADY_SETTLED", ((RejectedException) e).reason());
      assertEquals(a2, ((RejectedException) e).delivery());
      assertNull("settled again after ALREADY_SETTLED", got.poll(200, TimeUnit.MILLISECONDS));
      assertEquals("reads kept", 0, a2.session.heldReads());
      assertEquals("slots kept", 0, a2.session.heldSlots());
    }
  }

  /** The sidecar's answer to outcomes of slots whose partition was handed over. */
  static SubscribeResponse alreadySettled(long... slots) {
    Rejections.Builder rs = Rejections.newBuilder();
    for (long slot : slots) {
      rs.addRejections(
          Rejection.newBuilder()
              .setSlot(slot)
              .setReason(RejectionReason.REJECTION_REASON_ALREADY_SETTLED)
              .setMessage("slot " + slot + " already has an outcome or was abandoned"));
    }
    return SubscribeResponse.newBuilder().setRejections(rs).build();
  }

  /** The next error the listener got: a RejectedException ALREADY_SETTLED naming {@code d}. */
  static void nextRejected(LinkedBlockingQueue<WindowException> errors, Delivery d)
      throws InterruptedException {
    WindowException e = errors.poll(5, TimeUnit.SECONDS);
    assertTrue(String.valueOf(e), e instanceof RejectedException);
    assertEquals("ALREADY_SETTLED", ((RejectedException) e).reason());
    assertEquals(d, ((RejectedException) e).delivery());
  }

  /**
   * The sidecar's answer to a batch whose slot queued FLUSHALL and acked it: the command refused
   * (FORBIDDEN_COMMAND), then the ack (INCOMPLETE_SEGMENT), in one message.
   */
  static SubscribeResponse refusedFlushall(long slot) {
    return SubscribeResponse.newBuilder()
        .setRejections(
            Rejections.newBuilder()
                .addRejections(
                    Rejection.newBuilder()
                        .setSlot(slot)
                        .setReason(RejectionReason.REJECTION_REASON_FORBIDDEN_COMMAND)
                        .setCommand("FLUSHALL")
                        .setMessage("FLUSHALL is forbidden"))
                .addRejections(
                    Rejection.newBuilder()
                        .setSlot(slot)
                        .setReason(RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT)
                        .setMessage("incomplete")))
        .build();
  }

  /** A listener that adds each error it gets to {@code errors}. */
  static SubscriptionListener errorsTo(LinkedBlockingQueue<? super WindowException> errors) {
    return new SubscriptionListener() {
      @Override
      public void error(WindowException e) {
        errors.add(e);
      }
    };
  }

  /**
   * A partitioned stream whose partition was handed over while a read of it was out: the sidecar
   * refuses the read's outcomes ALREADY_SETTLED and never reports the read (the new owner
   * delivers the entries again). The listener hears of each refusal, nothing settles them again,
   * and the read and its slots are dropped at once rather than kept until the stream ends.
   */
  @Test
  public void outcomesRefusedAlreadySettledEndTheirRead() throws Exception {
    long p = 1L << 36; // a partition's range of read ids and slots
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client =
        start(
            answering(
                got, read(p + 1, p + 1, "1-0", "2-0", "3-0"), alreadySettled(p + 1, p + 2, p + 3)));
    LinkedBlockingQueue<WindowException> errors = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Flush> flushes = new LinkedBlockingQueue<>();
    SubscribeOptions o =
        options().partitions(4).listener(errorsTo(errors)).onFlush(flushes::add).build();
    try (Subscription sub = client.subscribe(o, later(ds))) {
      assertFalse(sub.isTerminated());
      List<Delivery> deliveries = List.of(take(ds), take(ds), take(ds));
      for (Delivery d : deliveries) {
        assertTrue(d.ack());
      }
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(3, b.getOutcomesCount());
      for (Delivery d : deliveries) {
        nextRejected(errors, d);
      }
      Session s = deliveries.get(0).session;
      assertEquals("reads kept", 0, s.heldReads());
      assertEquals("slots kept", 0, s.heldSlots());
      assertNull("settled again after ALREADY_SETTLED", got.poll(200, TimeUnit.MILLISECONDS));
      assertNull("a flush", flushes.poll());
      assertNull("another error", errors.poll());
    }
  }

  /**
   * Ordered and partitioned: a read's first outcome is flushed and reported, then its partition is
   * handed over and the second outcome is refused ALREADY_SETTLED. The read is done: no report
   * will come for the rest, and nothing of it is kept.
   */
  @Test
  public void aReadReportedInPartThenRefusedAlreadySettledIsDropped() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client =
        start(answering(got, read(1, 1, "1-0", "2-0"), flushed(1, 1), alreadySettled(1)));
    LinkedBlockingQueue<WindowException> errors = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Flush> flushes = new LinkedBlockingQueue<>();
    SubscribeOptions o =
        options()
            .orderingHeader("k")
            .partitions(4)
            .listener(errorsTo(errors))
            .onFlush(flushes::add)
            .build();
    try (Subscription sub = client.subscribe(o, later(ds))) {
      assertFalse(sub.isTerminated());
      Delivery slow = take(ds);
      Delivery fast = take(ds);
      assertTrue(fast.ack());
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(2, b.getOutcomes(0).getSlot());
      Flush f = flushes.poll(5, TimeUnit.SECONDS);
      assertNotNull(f);
      assertEquals(List.of(fast), f.settled());
      assertEquals("the reported delivery's slot is let go", 1, slow.session.heldSlots());
      assertTrue(slow.ack());
      b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(1, b.getOutcomes(0).getSlot());
      nextRejected(errors, slow);
      assertEquals("reads kept", 0, slow.session.heldReads());
      assertEquals("slots kept", 0, slow.session.heldSlots());
      assertNull("a flush", flushes.poll(200, TimeUnit.MILLISECONDS));
    }
  }

  /**
   * A lost stream: its deliveries go stale and nothing of them is sent on the next stream; the
   * client reconnects through ALREADY_EXISTS and the entry comes back.
   */
  @Test
  public void reconnectNeverResendsOldSlots() throws Exception {
    LinkedBlockingQueue<Batch> second = new LinkedBlockingQueue<>();
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "1-0", "2-0"));
              Thread.sleep(300);
              out.onError(Status.UNAVAILABLE.withDescription("shutting down").asException());
            },
            (out, in) -> out.onError(Status.ALREADY_EXISTS.withDescription("busy").asException()),
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "2-0"));
              for (Batch b = in.next(); b != null; b = in.next()) {
                second.add(b);
              }
              out.onCompleted();
            });
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub = client.subscribe(options().build(), later(ds))) {
      Delivery old1 = take(ds);
      Delivery old2 = take(ds);
      assertTrue(old1.queue("SET", "old", "1").ack()); // half of the read: nothing sent yet
      Delivery again = take(ds);
      assertNotSame(old2, again);
      assertEquals("2-0", again.entryId());
      assertFalse("settled on a lost stream", old2.ack());
      assertThrows(AlreadySettledException.class, () -> old1.drop("late"));
      assertTrue(again.queue("SET", "k", "v").ack());
      Batch b = second.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(1, b.getOutcomesCount());
      assertEquals(1, b.getOutcomes(0).getSlot());
      assertEquals(1, b.getCommandsCount());
      assertEquals("k", b.getCommands(0).getArgs(0).toStringUtf8());
      assertNull("an old slot was resent", second.poll(100, TimeUnit.MILLISECONDS));
      assertEquals(1, sub.reconnects());
      assertEquals(3, attempts.get());
    }
  }

  /**
   * The rejection rule: a refused command (and so the refused ack, INCOMPLETE_SEGMENT) leaves the
   * delivery open; the helper settles it with retry_after 1 s, the command's rejection as its
   * reason, and without the command. Never a drop: the entry survives (or reaches the dead letter
   * at the delivery cap).
   */
  @Test
  public void refusedCommandRetriesAfterOneSecond() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client = start(answering(got, read(1, 1, "1-0"), refusedFlushall(1)));
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub =
        client.subscribe(
            options().rejectedOutcome(RejectedOutcome.RETRY_AFTER).build(), later(ds))) {
      Delivery d = take(ds);
      assertTrue(d.queue("FLUSHALL").ack());
      Batch first = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(first);
      assertEquals(OutcomeKind.OUTCOME_KIND_ACK, first.getOutcomes(0).getKind());
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals("the refused command is not sent again", 0, b.getCommandsCount());
      assertEquals(1, b.getOutcomesCount());
      assertEquals(1, b.getOutcomes(0).getSlot());
      assertEquals(OutcomeKind.OUTCOME_KIND_RETRY_AFTER, b.getOutcomes(0).getKind());
      assertEquals(1, b.getOutcomes(0).getDelay().getSeconds());
      assertEquals(0, b.getOutcomes(0).getDelay().getNanos());
      assertEquals(
          "rejected: FORBIDDEN_COMMAND: FLUSHALL is forbidden", b.getOutcomes(0).getReason());
      assertEquals(OutcomeKind.OUTCOME_KIND_RETRY_AFTER, d.outcome());
      assertFalse(sub.isTerminated());
    }
  }

  /**
   * By default (AUTO) a subscription with a dead letter dead-letters a delivery whose command no
   * retry fixes at once, the cause as the reason; deadLetter without a dead letter is refused at
   * the call and settles nothing.
   */
  @Test
  public void aRefusedCommandIsDeadLetteredByDefault() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client = start(answering(got, read(1, 1, "1-0"), refusedFlushall(1)));
    LinkedBlockingQueue<WindowException> errors = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub =
        client.subscribe(
            options().deadLetter(5, "s:dead").listener(errorsTo(errors)).build(), later(ds))) {
      Delivery d = take(ds);
      assertTrue(d.queue("FLUSHALL").ack());
      Batch first = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(first);
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(0, b.getCommandsCount());
      assertEquals(1, b.getOutcomesCount());
      assertEquals(OutcomeKind.OUTCOME_KIND_DEAD_LETTER, b.getOutcomes(0).getKind());
      assertEquals(
          "rejected: FORBIDDEN_COMMAND: FLUSHALL is forbidden", b.getOutcomes(0).getReason());
      WindowException e = errors.poll(5, TimeUnit.SECONDS);
      assertTrue(String.valueOf(e), e instanceof RejectedException);
      assertEquals("dead_letter", ((RejectedException) e).outcome());
      assertFalse(sub.isTerminated());
    }
  }

  /**
   * A flush report's failed side effects and refused requeues reach the listener's error, after
   * onFlush got the report: a SideEffectException per failed command, a RequeueRefusedException
   * per refused requeue, each with its delivery.
   */
  @Test
  public void flushReportErrorsGoToTheListener() throws Exception {
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "1-0", "2-0"));
              in.next();
              out.onNext(
                  SubscribeResponse.newBuilder()
                      .setFlush(
                          FlushReport.newBuilder()
                              .setReadId(1)
                              .setSettles(1)
                              .addSideEffectFailures(
                                  SideEffectFailure.newBuilder()
                                      .setSlot(1)
                                      .setEntryId("1-0")
                                      .setCommand("HINCRBY")
                                      .setError("ERR hash value is not an integer")
                                      .setSettled(true))
                              .addRequeueRefused(
                                  RequeueRefusal.newBuilder()
                                      .setSlot(2)
                                      .setEntryId("2-0")
                                      .setError("OOM command not allowed")))
                      .build());
              in.awaitEnd();
              out.onCompleted();
            });
    LinkedBlockingQueue<Object> calls = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub =
        client.subscribe(
            options().listener(errorsTo(calls)).onFlush(f -> calls.add("flush")).build(),
            later(ds))) {
      Delivery d1 = take(ds);
      Delivery d2 = take(ds);
      d1.queue("HINCRBY", "h", "f", 1);
      assertTrue(d1.ack());
      assertTrue(d2.retry("later"));
      assertEquals("flush", calls.poll(5, TimeUnit.SECONDS));
      Object first = calls.poll(5, TimeUnit.SECONDS);
      assertTrue(String.valueOf(first), first instanceof SideEffectException);
      SideEffectException se = (SideEffectException) first;
      assertEquals("HINCRBY", se.command());
      assertTrue(se.settled());
      assertTrue(se.delivery() == d1);
      assertEquals(
          "side effect HINCRBY of entry 1-0 failed: ERR hash value is not an integer"
              + " (settled all the same: Redis has no rollback)",
          se.getMessage());
      Object second = calls.poll(5, TimeUnit.SECONDS);
      assertTrue(String.valueOf(second), second instanceof RequeueRefusedException);
      RequeueRefusedException re = (RequeueRefusedException) second;
      assertEquals("retry", re.outcome());
      assertTrue(re.delivery() == d2);
      assertEquals(
          "retry of entry 2-0 not written: OOM command not allowed;"
              + " it stays pending and is delivered again",
          re.getMessage());
      assertFalse(sub.isTerminated());
    }
  }

  /** deadLetter needs a dead letter: without one it throws at the call and settles nothing. */
  @Test
  public void deadLetterNeedsADeadLetter() throws Exception {
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "1-0"));
              in.awaitEnd();
              out.onCompleted();
            });
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub = client.subscribe(options().build(), later(ds))) {
      Delivery d = take(ds);
      IllegalStateException e = assertThrows(IllegalStateException.class, () -> d.deadLetter("bad"));
      assertTrue(e.getMessage(), e.getMessage().contains("dead-letter target"));
      assertFalse(d.isSettled());
      assertTrue(d.drop("bad"));
      assertFalse(sub.isTerminated());
    }
  }

  /** close() sends the outcomes given so far, also of a read not completely settled. */
  @Test
  public void closeSendsPartialOutcomes() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "1-0", "2-0"));
              for (Batch b = in.next(); b != null; b = in.next()) {
                got.add(b);
              }
              out.onNext(flushed(1, 1));
              out.onCompleted();
            });
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Flush> flushes = new LinkedBlockingQueue<>();
    Subscription sub = client.subscribe(options().onFlush(flushes::add).build(), later(ds));
    Delivery d1 = take(ds);
    Delivery d2 = take(ds);
    assertTrue(d1.ack());
    sub.close();
    assertNull(sub.error());
    Batch b = got.poll(5, TimeUnit.SECONDS);
    assertNotNull(b);
    assertEquals(1, b.getOutcomesCount());
    assertEquals(1, b.getOutcomes(0).getSlot());
    Flush f = flushes.poll(5, TimeUnit.SECONDS);
    assertNotNull(f);
    assertEquals(List.of(d1), f.settled());
    assertFalse("settled after close", d2.ack());
  }

  /** A handler that returns without settling acks its delivery, with the commands it queued. */
  @Test
  public void aHandlerThatReturnsAcks() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client = start(answering(got, read(1, 1, "1-0")));
    try (Subscription sub = client.subscribe(options().build(), d -> d.queue("INCR", "k"))) {
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(1, b.getCommandsCount());
      assertEquals(OutcomeKind.OUTCOME_KIND_ACK, b.getOutcomes(0).getKind());
      assertFalse(sub.isTerminated());
    }
  }

  /** INVALID_ARGUMENT is not retried: the subscription ends with it. */
  @Test
  public void invalidArgumentEnds() throws Exception {
    WindowClient client =
        start((out, in) -> out.onError(Status.INVALID_ARGUMENT.withDescription("count").asException()));
    Subscription sub = client.subscribe(options().build(), d -> {});
    assertTrue(sub.awaitTermination(Duration.ofSeconds(5)));
    assertEquals(Status.Code.INVALID_ARGUMENT, Status.fromThrowable(sub.error()).getCode());
    assertEquals(1, attempts.get());
  }

  /** A handler that throws leaves its delivery to retry_after. */
  @Test
  public void handlerFailureRetriesAfter() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client = start(answering(got, read(1, 1, "1-0")));
    SubscribeOptions opts = options().retryDelay(Duration.ofMillis(250)).build();
    try (Subscription sub =
        client.subscribe(
            opts,
            d -> {
              throw new IllegalStateException("boom");
            })) {
      assertFalse(sub.isTerminated());
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(OutcomeKind.OUTCOME_KIND_RETRY_AFTER, b.getOutcomes(0).getKind());
      assertEquals(250_000_000, b.getOutcomes(0).getDelay().getNanos());
      assertTrue(b.getOutcomes(0).getReason().contains("boom"));
    }
  }

  /**
   * The typed command API queues what Redis's specification describes (arguments in its order,
   * optional ones only when set); the default rejected outcome drops a FORBIDDEN_COMMAND at once,
   * with the cause as the reason, and hands the listener a RejectedException naming it, never
   * the sidecar's advice; a reason a retry may fix is retried after the growing delay.
   */
  @Test
  public void typedCommandsAndTheRefusedCommandRule() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    Read.Builder rb = read(1, 1, "1-0", "2-0").getRead().toBuilder();
    rb.setDeliveries(1, rb.getDeliveries(1).toBuilder().setDeliveryCount(3));
    WindowClient client =
        start(
            answering(
                got,
                SubscribeResponse.newBuilder().setRead(rb).build(),
                SubscribeResponse.newBuilder()
                    .setRejections(
                        Rejections.newBuilder()
                            .addRejections(
                                Rejection.newBuilder()
                                    .setSlot(1)
                                    .setReason(RejectionReason.REJECTION_REASON_FORBIDDEN_COMMAND)
                                    .setCommand("FLUSHALL")
                                    .setMessage("FLUSHALL is forbidden"))
                            .addRejections(
                                Rejection.newBuilder()
                                    .setSlot(1)
                                    .setReason(RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT)
                                    .setMessage("settle it with drop, retry or retry_after"))
                            .addRejections(
                                Rejection.newBuilder()
                                    .setSlot(2)
                                    .setReason(RejectionReason.REJECTION_REASON_LIMIT_EXCEEDED)
                                    .setCommand("SET")
                                    .setMessage("too large"))
                            .addRejections(
                                Rejection.newBuilder()
                                    .setSlot(2)
                                    .setReason(RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT)
                                    .setMessage("settle it with drop, retry or retry_after")))
                    .build()));
    LinkedBlockingQueue<WindowException> errors = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub = client.subscribe(options().listener(errorsTo(errors)).build(), later(ds))) {
      Delivery d1 = take(ds);
      Delivery d2 = take(ds);
      d1.redis()
          .hincrby("totals", "apple", 2)
          .set("k", "v", new RedisCommands.SetOptions().condition(RedisCommands.SetCondition.NX)
              .expiration(RedisCommands.SetExpiration.ex(60)))
          .xadd(
              "s",
              "*",
              new RedisCommands.XaddOptions()
                  .trim(
                      new RedisCommands.XaddTrim(RedisCommands.XaddTrimStrategy.MAXLEN, 1000)
                          .operator(RedisCommands.XaddTrimOperator.APPROXIMATELY)),
              new RedisCommands.XaddFieldValue("sku", "apple"),
              new RedisCommands.XaddFieldValue("qty", 2))
          .zunionstore("dst", new RedisCommands.ZunionstoreOptions().weight(List.of(1L, 2L)), "a", "b")
          .del("a", "b")
          .lpop("l", new RedisCommands.LpopOptions().count(2L));
      d1.queue("FLUSHALL");
      assertTrue(d1.ack());
      d2.queue("SET", "k", "v");
      assertTrue(d2.ack());
      Batch first = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(first);
      List<String> want =
          List.of(
              "HINCRBY totals apple 2",
              "SET k v NX EX 60",
              "XADD s MAXLEN ~ 1000 * sku apple qty 2",
              "ZUNIONSTORE dst 2 a b WEIGHTS 1 2",
              "DEL a b",
              "LPOP l 2",
              "FLUSHALL",
              "SET k v");
      for (int i = 0; i < want.size(); i++) {
        StringBuilder line = new StringBuilder(first.getCommands(i).getName());
        first.getCommands(i).getArgsList().forEach(a -> line.append(' ').append(a.toStringUtf8()));
        assertEquals(want.get(i), line.toString());
      }
      List<dev.windowsidecar.v1.Outcome> outcomes = new java.util.ArrayList<>();
      while (outcomes.size() < 2) {
        Batch b = got.poll(5, TimeUnit.SECONDS);
        assertNotNull(b);
        assertEquals(0, b.getCommandsCount());
        outcomes.addAll(b.getOutcomesList());
      }
      assertEquals(OutcomeKind.OUTCOME_KIND_DROP, outcomes.get(0).getKind());
      assertEquals("rejected: FORBIDDEN_COMMAND: FLUSHALL is forbidden", outcomes.get(0).getReason());
      assertEquals(OutcomeKind.OUTCOME_KIND_RETRY_AFTER, outcomes.get(1).getKind());
      assertEquals("third delivery: 1 s doubled twice", 4, outcomes.get(1).getDelay().getSeconds());
      for (String reason : List.of("FORBIDDEN_COMMAND", "LIMIT_EXCEEDED")) {
        WindowException e = errors.poll(5, TimeUnit.SECONDS);
        assertTrue(String.valueOf(e), e instanceof RejectedException);
        assertEquals(reason, ((RejectedException) e).reason());
        assertFalse(e.getMessage(), e.getMessage().contains("settle it with"));
      }
      assertThrows(AlreadySettledException.class, () -> d1.redis().incr("k"));
      assertTrue(RedisCommands.COMMAND_NAMES.contains("HINCRBY"));
      assertFalse(sub.isTerminated());
    }
  }

  /** An entry in the payload layout reads as text and JSON; one with plain fields has fields. */
  @Test
  public void payloadAndFields() throws Exception {
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              Read.Builder r = Read.newBuilder().setReadId(1);
              r.addDeliveries(
                  dev.windowsidecar.v1.Delivery.newBuilder()
                      .setSlot(1)
                      .setEntryId("1-0")
                      .setPayload(ByteString.copyFromUtf8("{\"sku\":\"apple\"}"))
                      .setDeliveryCount(1));
              r.addDeliveries(
                  dev.windowsidecar.v1.Delivery.newBuilder()
                      .setSlot(2)
                      .setEntryId("2-0")
                      .addFields(
                          dev.windowsidecar.v1.Field.newBuilder()
                              .setName(ByteString.copyFromUtf8("sku"))
                              .setValue(ByteString.copyFromUtf8("pear")))
                      .addFields(
                          dev.windowsidecar.v1.Field.newBuilder()
                              .setName(ByteString.copyFromUtf8("qty"))
                              .setValue(ByteString.copyFromUtf8("10")))
                      .setDeliveryCount(1));
              out.onNext(SubscribeResponse.newBuilder().setRead(r).build());
              in.awaitEnd();
              out.onCompleted();
            });
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub = client.subscribe(options().build(), later(ds))) {
      Delivery d = take(ds);
      Delivery f = take(ds);
      assertTrue(d.hasPayload());
      assertEquals("{\"sku\":\"apple\"}", d.text());
      assertEquals("apple", d.json(Sku.class).sku);
      assertTrue(d.fields().isEmpty());
      assertFalse(f.hasPayload());
      assertEquals(java.util.Map.of("sku", "pear", "qty", "10"), f.textFields());
      assertEquals(ByteString.copyFromUtf8("10"), f.fields().get("qty"));
      WindowException e = assertThrows(WindowException.class, () -> f.json(Sku.class));
      assertTrue(e.getMessage(), e.getMessage().contains("fields()") && e.getMessage().contains("sku, qty"));
      assertThrows(WindowException.class, f::text);
      d.ack();
      f.ack();
      assertFalse(sub.isTerminated());
    }
  }

  static final class Sku {
    String sku;
  }

  /**
   * Nothing listens at the address: publish fails fast with a ConnectionException naming the
   * address and the cause; a subscription gives up after maxAttempts with a
   * SubscriptionEndedException, given to the listener and kept as error().
   */
  @Test
  public void aClosedAddressFailsFast() throws Exception {
    int port;
    try (java.net.ServerSocket s = new java.net.ServerSocket(0)) {
      port = s.getLocalPort();
    }
    String addr = "127.0.0.1:" + port;
    try (WindowClient client = WindowClient.builder().target(addr).plaintext().connect()) {
      long began = System.nanoTime();
      java.util.concurrent.CompletionException failed =
          assertThrows(
              java.util.concurrent.CompletionException.class,
              () -> client.publish("s", List.of(WindowClient.Message.of("a"))).join());
      assertTrue(System.nanoTime() - began < TimeUnit.SECONDS.toNanos(5));
      assertTrue(String.valueOf(failed.getCause()), failed.getCause() instanceof ConnectionException);
      assertEquals(
          "cannot reach the sidecar at "
              + addr
              + ": connection refused; nothing listens there: start the sidecar, or set"
              + " WINDOW_SIDECAR_ADDR (or the client's address) to the sidecar's gRPC address, its"
              + " --listen (127.0.0.1:50051 by default)",
          failed.getCause().getMessage());
      assertEquals(Status.Code.UNAVAILABLE, ((WindowException) failed.getCause()).getStatus().getCode());

      LinkedBlockingQueue<WindowException> errors = new LinkedBlockingQueue<>();
      Subscription sub =
          client.subscribe(options().maxAttempts(3).listener(errorsTo(errors)).build(), d -> {});
      assertTrue(sub.awaitTermination(Duration.ofSeconds(20)));
      assertTrue(String.valueOf(sub.error()), sub.error() instanceof SubscriptionEndedException);
      assertEquals(3, ((SubscriptionEndedException) sub.error()).attempts());
      assertTrue(sub.error().getMessage(), sub.error().getMessage().contains(addr + ": connection refused"));
      assertEquals(sub.error(), errors.poll(5, TimeUnit.SECONDS));
    }
  }
}
