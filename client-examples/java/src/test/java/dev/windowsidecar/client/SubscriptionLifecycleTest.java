package dev.windowsidecar.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import com.google.protobuf.ByteString;
import dev.windowsidecar.v1.Batch;
import dev.windowsidecar.v1.Draining;
import dev.windowsidecar.v1.FlushReport;
import dev.windowsidecar.v1.Opened;
import dev.windowsidecar.v1.OutcomeKind;
import dev.windowsidecar.v1.Read;
import dev.windowsidecar.v1.SubscribeRequest;
import dev.windowsidecar.v1.SubscribeResponse;
import dev.windowsidecar.v1.WindowServiceGrpc;
import io.grpc.ManagedChannel;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.stub.StreamObserver;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.logging.Level;
import java.util.logging.Logger;
import org.junit.After;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * Draining, the lifecycle listener, packed acks and reports in reads, against a scripted
 * in-process sidecar.
 */
public class SubscriptionLifecycleTest {
  private static final Object END = new Object();

  interface Script {
    void run(Open open, StreamObserver<SubscribeResponse> out, LinkedBlockingQueue<Object> in)
        throws Exception;
  }

  /** The client's {@code open}. */
  record Open(dev.windowsidecar.v1.Open message) {}

  private Server server;
  private ManagedChannel channel;
  private final AtomicReference<Throwable> scriptFailure = new AtomicReference<>();

  @BeforeClass
  public static void quiet() {
    Logger.getLogger("dev.windowsidecar.client").setLevel(Level.OFF);
  }

  private WindowClient start(Script... scripts) throws Exception {
    String name = InProcessServerBuilder.generateName();
    int[] attempt = {0};
    WindowServiceGrpc.WindowServiceImplBase fake =
        new WindowServiceGrpc.WindowServiceImplBase() {
          @Override
          public StreamObserver<SubscribeRequest> subscribe(StreamObserver<SubscribeResponse> out) {
            int n;
            synchronized (attempt) {
              n = attempt[0]++;
            }
            LinkedBlockingQueue<Object> in = new LinkedBlockingQueue<>();
            Thread t =
                new Thread(
                    () -> {
                      try {
                        SubscribeRequest first = (SubscribeRequest) in.take();
                        if (n < scripts.length) {
                          scripts[n].run(new Open(first.getOpen()), out, in);
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
                in.add(m);
              }

              @Override
              public void onError(Throwable e) {
                in.add(END);
              }

              @Override
              public void onCompleted() {
                in.add(END);
              }
            };
          }
        };
    server = InProcessServerBuilder.forName(name).addService(fake).build().start();
    channel = InProcessChannelBuilder.forName(name).build();
    return WindowClient.of(channel);
  }

  @After
  public void stop() {
    channel.shutdownNow();
    server.shutdownNow();
    if (scriptFailure.get() != null) {
      throw new AssertionError("the fake sidecar failed", scriptFailure.get());
    }
  }

  /** The next batch from the client, null when it half-closed or went away. */
  static Batch next(LinkedBlockingQueue<Object> in) throws InterruptedException {
    Object m = in.poll(5, TimeUnit.SECONDS);
    if (m == null) {
      throw new AssertionError("no message from the client");
    }
    return m == END ? null : ((SubscribeRequest) m).getBatch();
  }

  static void awaitEnd(LinkedBlockingQueue<Object> in) throws InterruptedException {
    while (next(in) != null) {}
  }

  static SubscribeResponse opened() {
    return SubscribeResponse.newBuilder()
        .setOpened(Opened.newBuilder().setConsumer("c").setCount(16).setMaxInFlight(32))
        .build();
  }

  static Read.Builder read(long id, long firstSlot, String... entries) {
    Read.Builder r = Read.newBuilder().setReadId(id);
    for (int i = 0; i < entries.length; i++) {
      r.addDeliveries(
          dev.windowsidecar.v1.Delivery.newBuilder()
              .setSlot(firstSlot + i)
              .setEntryId(entries[i])
              .setPayload(ByteString.copyFromUtf8(entries[i]))
              .setDeliveryCount(1));
    }
    return r;
  }

  static SubscribeResponse msg(Read.Builder r) {
    return SubscribeResponse.newBuilder().setRead(r).build();
  }

  /**
   * The sidecar's answer to a batch whose slot queued FLUSHALL and acked it: the command refused
   * (FORBIDDEN_COMMAND), then the ack (INCOMPLETE_SEGMENT), in one message.
   */
  static SubscribeResponse refusedFlushall(long slot) {
    dev.windowsidecar.v1.Rejection.Builder command =
        dev.windowsidecar.v1.Rejection.newBuilder()
            .setSlot(slot)
            .setReason(dev.windowsidecar.v1.RejectionReason.REJECTION_REASON_FORBIDDEN_COMMAND)
            .setCommand("FLUSHALL")
            .setMessage("forbidden");
    dev.windowsidecar.v1.Rejection.Builder ack =
        dev.windowsidecar.v1.Rejection.newBuilder()
            .setSlot(slot)
            .setReason(dev.windowsidecar.v1.RejectionReason.REJECTION_REASON_INCOMPLETE_SEGMENT)
            .setMessage("incomplete");
    return SubscribeResponse.newBuilder()
        .setRejections(
            dev.windowsidecar.v1.Rejections.newBuilder().addRejections(command).addRejections(ack))
        .build();
  }

  static SubscribeOptions.Builder options() {
    return SubscribeOptions.builder("s", "g").backoff(Duration.ofMillis(10), Duration.ofMillis(20));
  }

  /** A handler that leaves its deliveries to the test thread to settle. */
  static DeliveryHandler later(LinkedBlockingQueue<Delivery> ds) {
    return d -> ds.add(d.settleLater());
  }

  /** Every listener call, as a word. */
  static final class Events implements SubscriptionListener {
    final LinkedBlockingQueue<String> seen = new LinkedBlockingQueue<>();

    @Override
    public void opened(Opened opened) {
      seen.add("opened");
    }

    @Override
    public void resubscribed(Opened opened, int reconnects) {
      seen.add("resubscribed " + reconnects);
    }

    @Override
    public void draining(Duration grace, int outstanding) {
      seen.add("draining " + grace.toMillis() + " " + outstanding);
    }

    @Override
    public void disconnected(Throwable cause, Duration retryIn) {
      seen.add("disconnected " + Status.fromThrowable(cause).getCode());
    }

    String next() throws InterruptedException {
      String e = seen.poll(5, TimeUnit.SECONDS);
      assertNotNull("no listener event", e);
      return e;
    }
  }

  /**
   * On {@code draining} the client hands out nothing more, sends an outcome given within the
   * grace at once (not waiting for the rest of its read), reports the drain, and resubscribes
   * when the stream ends.
   */
  @Test
  public void drainingSendsOutcomesAtOnceAndResubscribes() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    CountDownLatch holding = new CountDownLatch(1);
    CountDownLatch drained = new CountDownLatch(1);
    CountDownLatch second = new CountDownLatch(1);
    WindowClient client =
        start(
            (open, out, in) -> {
              out.onNext(opened());
              out.onNext(msg(read(1, 1, "1-0", "2-0")));
              assertTrue(holding.await(5, TimeUnit.SECONDS)); // the handler holds 1-0
              out.onNext(
                  SubscribeResponse.newBuilder()
                      .setDraining(
                          Draining.newBuilder()
                              .setGrace(com.google.protobuf.Duration.newBuilder().setSeconds(5))
                              .setOutstanding(2))
                      .build());
              drained.countDown();
              got.add(next(in));
              out.onError(Status.UNAVAILABLE.withDescription("shutting down").asException());
            },
            (open, out, in) -> {
              out.onNext(opened());
              second.countDown();
              awaitEnd(in);
              out.onCompleted();
            });
    LinkedBlockingQueue<Delivery> handed = new LinkedBlockingQueue<>();
    Events events = new Events();
    try (Subscription sub =
        client.subscribe(
            options().listener(events).build(),
            d -> {
              handed.add(d);
              holding.countDown();
              assertTrue(drained.await(5, TimeUnit.SECONDS));
              Thread.sleep(100); // the drain reaches the client before the ack
              d.ack();
            })) {
      assertEquals("opened", events.next());
      assertEquals("draining 5000 2", events.next());
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull("the ack within the grace was not sent", b);
      assertEquals(1, b.getOutcomesCount());
      assertEquals(1, b.getOutcomes(0).getSlot());
      assertEquals(OutcomeKind.OUTCOME_KIND_ACK, b.getOutcomes(0).getKind());
      assertEquals("disconnected UNAVAILABLE", events.next());
      assertEquals("resubscribed 1", events.next());
      assertTrue(second.await(5, TimeUnit.SECONDS));
      assertEquals("1-0", handed.take().entryId());
      assertNull("a delivery was handed out while draining", handed.poll(200, TimeUnit.MILLISECONDS));
      assertEquals(1, sub.reconnects());
    }
  }

  /**
   * Draining with a long grace: once the one delivery the handler started is settled, the client
   * sends its outcome and half-closes at once (the sidecar then ends the subscription), never
   * handing out the two it received behind it; with nothing started it half-closes at once.
   */
  @Test
  public void drainingHalfClosesOnceTheStartedAreSettled() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Long> halfClosedAfterMs = new LinkedBlockingQueue<>();
    CountDownLatch holding = new CountDownLatch(1);
    CountDownLatch third = new CountDownLatch(1);
    SubscribeResponse drain =
        SubscribeResponse.newBuilder()
            .setDraining(
                Draining.newBuilder()
                    .setGrace(com.google.protobuf.Duration.newBuilder().setSeconds(30))
                    .setOutstanding(3))
            .build();
    WindowClient client =
        start(
            (open, out, in) -> {
              out.onNext(opened());
              out.onNext(msg(read(1, 1, "1-0", "2-0", "3-0")));
              assertTrue(holding.await(5, TimeUnit.SECONDS)); // the handler holds 1-0
              long began = System.nanoTime();
              out.onNext(drain);
              for (Batch b = next(in); b != null; b = next(in)) {
                got.add(b);
              }
              halfClosedAfterMs.add((System.nanoTime() - began) / 1_000_000);
              out.onCompleted(); // the sidecar ends the subscription once the client half-closed
            },
            (open, out, in) -> {
              // Nothing started: the handler is still busy with the first stream's delivery.
              out.onNext(opened());
              long began = System.nanoTime();
              out.onNext(drain);
              awaitEnd(in);
              halfClosedAfterMs.add((System.nanoTime() - began) / 1_000_000);
              out.onCompleted();
            },
            (open, out, in) -> {
              out.onNext(opened());
              third.countDown();
              awaitEnd(in);
              out.onCompleted();
            });
    LinkedBlockingQueue<String> handed = new LinkedBlockingQueue<>();
    try (Subscription sub =
        client.subscribe(
            options().build(),
            d -> {
              handed.add(d.entryId());
              holding.countDown();
              Thread.sleep(300);
              d.ack();
            })) {
      Long first = halfClosedAfterMs.poll(10, TimeUnit.SECONDS);
      assertNotNull("no half-close after the started delivery was settled", first);
      assertTrue("half-closed after " + first + " ms", first >= 200 && first < 5_000);
      Batch b = got.poll(1, TimeUnit.SECONDS);
      assertNotNull("the started delivery's ack was not sent", b);
      assertEquals(1, b.getOutcomesCount());
      assertEquals(1, b.getOutcomes(0).getSlot());
      assertNull("an outcome of a delivery never started", got.poll(100, TimeUnit.MILLISECONDS));
      Long second = halfClosedAfterMs.poll(10, TimeUnit.SECONDS);
      assertNotNull("no half-close with nothing started", second);
      assertTrue("half-closed after " + second + " ms", second < 5_000);
      assertTrue(third.await(10, TimeUnit.SECONDS));
      assertEquals("1-0", handed.take());
      assertNull("a delivery was handed out while draining", handed.poll(200, TimeUnit.MILLISECONDS));
      assertEquals(2, sub.reconnects());
    }
  }

  /** An outcome given before the drain and held back with its read goes out on the drain. */
  @Test
  public void drainingSendsHeldOutcomes() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    CountDownLatch acked = new CountDownLatch(1);
    WindowClient client =
        start(
            (open, out, in) -> {
              out.onNext(opened());
              out.onNext(msg(read(1, 1, "1-0", "2-0")));
              assertTrue(acked.await(5, TimeUnit.SECONDS));
              assertNull("sent before the read was settled", in.poll(100, TimeUnit.MILLISECONDS));
              out.onNext(SubscribeResponse.newBuilder().setDraining(Draining.newBuilder()).build());
              got.add(next(in));
              awaitEnd(in);
              out.onCompleted();
            });
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub = client.subscribe(options().build(), later(ds))) {
      Delivery d1 = ds.poll(5, TimeUnit.SECONDS);
      assertNotNull(d1);
      assertTrue(d1.queue("INCR", "k").ack());
      acked.countDown();
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(1, b.getOutcomesCount());
      assertEquals(1, b.getCommandsCount());
      assertFalse(sub.isTerminated());
    }
  }

  /** A refused ack sent alone while draining is settled again at once, with retry_after 1 s. */
  @Test
  public void aRefusedOutcomeWhileDrainingIsSettledAgain() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    CountDownLatch drainSeen = new CountDownLatch(1);
    WindowClient client =
        start(
            (open, out, in) -> {
              out.onNext(opened());
              out.onNext(msg(read(1, 1, "1-0", "2-0")));
              for (int i = 0; i < 500 && ds.size() < 2; i++) {
                Thread.sleep(10); // both handed out
              }
              out.onNext(SubscribeResponse.newBuilder().setDraining(Draining.newBuilder()).build());
              got.add(next(in));
              out.onNext(refusedFlushall(1));
              got.add(next(in));
              awaitEnd(in);
              out.onCompleted();
            });
    SubscriptionListener listener =
        new SubscriptionListener() {
          @Override
          public void draining(Duration grace, int outstanding) {
            drainSeen.countDown();
          }
        };
    try (Subscription sub =
        client.subscribe(
            options().listener(listener).rejectedOutcome(RejectedOutcome.RETRY_AFTER).build(),
            later(ds))) {
      assertTrue(drainSeen.await(5, TimeUnit.SECONDS));
      Delivery d = ds.poll(5, TimeUnit.SECONDS);
      assertNotNull(d);
      assertTrue(d.queue("FLUSHALL").ack());
      Batch first = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(first);
      assertEquals(OutcomeKind.OUTCOME_KIND_ACK, first.getOutcomes(0).getKind());
      Batch again = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(again);
      assertEquals(0, again.getCommandsCount());
      assertEquals(OutcomeKind.OUTCOME_KIND_RETRY_AFTER, again.getOutcomes(0).getKind());
      assertEquals("rejected: FORBIDDEN_COMMAND: forbidden", again.getOutcomes(0).getReason());
      assertFalse(sub.isTerminated());
    }
  }

  /**
   * A rejection that arrives while the handler still runs after its ack: the client settles the
   * reopened delivery anew under the lock that reopened it, so the handler never finds it open
   * (its return would ack it a second time, and the client's own outcome would then throw inside
   * the stream's callback and end the stream). Each round the handler acks, then watches its
   * delivery until the rejection is reported; the sidecar must see one drop after each refused
   * ack, and nothing else, on one stream.
   */
  @Test
  public void aRejectionRacingTheHandlerNeverShowsItOpen() throws Exception {
    int rounds = 100;
    LinkedBlockingQueue<String> faults = new LinkedBlockingQueue<>();
    CountDownLatch done = new CountDownLatch(1);
    WindowClient client =
        start(
            (open, out, in) -> {
              out.onNext(opened());
              for (long i = 1; i <= rounds; i++) {
                out.onNext(msg(read(i, i, i + "-0")));
                Batch acked = next(in);
                if (acked == null || acked.getCommandsCount() != 1) {
                  faults.add("round " + i + ": the handler's batch: " + acked);
                  break;
                }
                out.onNext(refusedFlushall(i));
                Batch again = next(in);
                if (again == null
                    || again.getCommandsCount() != 0
                    || again.getAcksCount() != 0
                    || again.getOutcomesCount() != 1
                    || again.getOutcomes(0).getSlot() != i
                    || again.getOutcomes(0).getKind() != OutcomeKind.OUTCOME_KIND_DROP) {
                  faults.add("round " + i + ": after the rejection: " + again);
                  break;
                }
                out.onNext(
                    SubscribeResponse.newBuilder()
                        .setFlush(FlushReport.newBuilder().setReadId(i).setSettles(1).setOk(true))
                        .build());
              }
              done.countDown();
              awaitEnd(in);
              out.onCompleted();
            });
    LinkedBlockingQueue<RejectedException> reported = new LinkedBlockingQueue<>();
    SubscriptionListener listener =
        new SubscriptionListener() {
          @Override
          public void error(WindowException e) {
            if (e instanceof RejectedException r) {
              reported.add(r);
            }
          }
        };
    DeliveryHandler handler =
        d -> {
          d.queue("FLUSHALL").ack();
          long giveUp = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
          while (true) {
            if (System.nanoTime() > giveUp) {
              faults.add("slot " + d.slot() + ": no rejection reported within 10 s");
              return;
            }
            Thread.onSpinWait();
            RejectedException r = reported.poll();
            if (r != null) {
              if (!r.getMessage().endsWith("the client settled it with drop")) {
                faults.add("slot " + d.slot() + ": reported " + r.getMessage());
              }
              return;
            }
            if (!d.isSettled()) {
              faults.add("slot " + d.slot() + ": the handler found its delivery open after its ack");
              return;
            }
          }
        };
    try (Subscription sub = client.subscribe(options().listener(listener).build(), handler)) {
      boolean finished = done.await(30, TimeUnit.SECONDS);
      assertNull(faults.poll());
      assertTrue("the rounds did not finish", finished);
      assertEquals(0, sub.reconnects());
      assertFalse(sub.isTerminated());
    }
  }

  /** extend() sends the slot in {@code extend} at once; the outcome follows as usual. */
  @Test
  public void extendSendsTheSlot() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client =
        start(
            (open, out, in) -> {
              out.onNext(opened());
              out.onNext(msg(read(1, 1, "1-0")));
              got.add(next(in));
              got.add(next(in));
              awaitEnd(in);
              out.onCompleted();
            });
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub = client.subscribe(options().build(), later(ds))) {
      Delivery d = ds.poll(5, TimeUnit.SECONDS);
      assertNotNull(d);
      assertTrue(d.extend());
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(List.of(1L), b.getExtendList());
      assertEquals(0, b.getOutcomesCount());
      assertTrue(d.ack());
      Batch settled = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(settled);
      assertEquals(1, settled.getOutcomesCount());
      assertThrows(AlreadySettledException.class, d::extend);
      assertFalse(sub.isTerminated());
    }
  }

  /** A first open that fails and a second that works: opened, not resubscribed. */
  @Test
  public void aFailedFirstOpenIsNoResubscription() throws Exception {
    CountDownLatch open = new CountDownLatch(1);
    WindowClient client =
        start(
            (o, out, in) -> out.onError(Status.UNAVAILABLE.withDescription("starting").asException()),
            (o, out, in) -> {
              out.onNext(opened());
              open.countDown();
              awaitEnd(in);
              out.onCompleted();
            });
    Events events = new Events();
    try (Subscription sub = client.subscribe(options().listener(events).build(), d -> {})) {
      assertEquals("disconnected UNAVAILABLE", events.next());
      assertEquals("opened", events.next());
      assertTrue(open.await(5, TimeUnit.SECONDS));
      assertEquals(0, sub.reconnects());
    }
  }

  /**
   * Packed acks: plain acks go as slots in {@code Batch.acks}; an ack with a trace context and
   * other outcomes stay in {@code outcomes}, with the trace.
   */
  @Test
  public void packedAcks() throws Exception {
    LinkedBlockingQueue<Batch> got = new LinkedBlockingQueue<>();
    WindowClient client =
        start(
            (open, out, in) -> {
              out.onNext(opened());
              out.onNext(msg(read(1, 1, "1-0", "2-0", "3-0")));
              got.add(next(in));
              awaitEnd(in);
              out.onCompleted();
            });
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    String tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    try (Subscription sub = client.subscribe(options().packedAcks(true).build(), later(ds))) {
      ds.take().queue("INCR", "a").ack();
      ds.take().withHandlingTrace(tp, "k=v").ack();
      ds.take().drop("bad");
      Batch b = got.poll(5, TimeUnit.SECONDS);
      assertNotNull(b);
      assertEquals(List.of(1L), b.getAcksList());
      assertEquals(1, b.getCommandsCount());
      assertEquals(2, b.getOutcomesCount());
      assertEquals(2, b.getOutcomes(0).getSlot());
      assertEquals(tp, b.getOutcomes(0).getTrace().getTraceparent());
      assertEquals("k=v", b.getOutcomes(0).getTrace().getTracestate());
      assertEquals(OutcomeKind.OUTCOME_KIND_DROP, b.getOutcomes(1).getKind());
      assertFalse(sub.isTerminated());
    }
  }

  /**
   * Reports in reads: the Open asks for them, and a read's {@code flushed} report reaches onFlush
   * before the read's deliveries reach the handler.
   */
  @Test
  public void reportsInReads() throws Exception {
    AtomicReference<dev.windowsidecar.v1.Open> seenOpen = new AtomicReference<>();
    WindowClient client =
        start(
            (open, out, in) -> {
              seenOpen.set(open.message());
              out.onNext(opened());
              out.onNext(msg(read(1, 1, "1-0")));
              assertEquals(1, next(in).getOutcomesCount());
              out.onNext(
                  msg(
                      read(2, 2, "2-0")
                          .setFlushed(FlushReport.newBuilder().setReadId(1).setSettles(1).setOk(true))));
              awaitEnd(in);
              out.onCompleted();
            });
    LinkedBlockingQueue<String> order = new LinkedBlockingQueue<>();
    try (Subscription sub =
        client.subscribe(
            options()
                .reportsInReads(true)
                .onFlush(f -> order.add("flush " + f.report().getReadId() + " " + f.settled().size()))
                .build(),
            d -> {
              order.add("delivery " + d.entryId());
              d.ack();
            })) {
      assertEquals("delivery 1-0", order.poll(5, TimeUnit.SECONDS));
      assertEquals("flush 1 1", order.poll(5, TimeUnit.SECONDS));
      assertEquals("delivery 2-0", order.poll(5, TimeUnit.SECONDS));
      assertTrue(seenOpen.get().getReportsInReads());
      assertFalse(sub.isTerminated());
    }
  }
}
