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
import dev.windowsidecar.v1.Opened;
import dev.windowsidecar.v1.OutcomeKind;
import dev.windowsidecar.v1.Read;
import dev.windowsidecar.v1.Rejection;
import dev.windowsidecar.v1.RejectionReason;
import dev.windowsidecar.v1.Rejections;
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
    channel.shutdownNow();
    server.shutdownNow();
    if (scriptFailure.get() != null) {
      throw new AssertionError("the fake sidecar failed", scriptFailure.get());
    }
  }

  static SubscribeResponse opened() {
    return SubscribeResponse.newBuilder()
        .setOpened(Opened.newBuilder().setConsumer("c").setCount(16).setMaxInFlight(32))
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

  static SubscribeResponse flushed(long id, int settles) {
    return SubscribeResponse.newBuilder()
        .setFlush(FlushReport.newBuilder().setReadId(id).setSettles(settles).setOk(true))
        .build();
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
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "1-0", "2-0", "3-0"));
              got.add(in.next());
              out.onNext(flushed(1, 3));
              in.awaitEnd();
              out.onCompleted();
            });
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
      assertThrows(IllegalStateException.class, d3::ack);
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
      assertThrows(IllegalStateException.class, () -> old1.drop("late"));
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
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "1-0"));
              got.add(in.next());
              out.onNext(
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
                                      .setMessage("incomplete")))
                      .build());
              got.add(in.next());
              in.awaitEnd();
              out.onCompleted();
            });
    LinkedBlockingQueue<Delivery> ds = new LinkedBlockingQueue<>();
    try (Subscription sub = client.subscribe(options().build(), later(ds))) {
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
      assertEquals("rejected: FLUSHALL is forbidden", b.getOutcomes(0).getReason());
      assertEquals(OutcomeKind.OUTCOME_KIND_RETRY_AFTER, d.outcome());
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
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "1-0"));
              got.add(in.next());
              in.awaitEnd();
              out.onCompleted();
            });
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
    WindowClient client =
        start(
            (out, in) -> {
              out.onNext(opened());
              out.onNext(read(1, 1, "1-0"));
              got.add(in.next());
              in.awaitEnd();
              out.onCompleted();
            });
    SubscribeOptions opts = options().errorRetryDelay(Duration.ofMillis(250)).build();
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
}
