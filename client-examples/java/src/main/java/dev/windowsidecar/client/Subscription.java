package dev.windowsidecar.client;

import dev.windowsidecar.v1.Opened;
import dev.windowsidecar.v1.SubscribeRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * A running subscription. It calls the handler for every delivery, on its own thread, and
 * reconnects with backoff when its stream fails (UNAVAILABLE, ALREADY_EXISTS, connection
 * errors). Deliveries of a lost stream are never settled on a new one: their entries stay pending
 * and the sidecar delivers them again first on the new stream. {@link #close} ends it gracefully.
 */
public final class Subscription implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(Subscription.class.getName());

  private final WindowClient client;
  final SubscribeOptions options;
  /** One of the two is set: deliveries one at a time, or a read at a time. */
  private final DeliveryHandler handler;
  private final BatchHandler batchHandler;
  private final Thread thread;
  private final CountDownLatch closeRequested = new CountDownLatch(1);
  private final CountDownLatch terminated = new CountDownLatch(1);
  private volatile Throwable error;
  private volatile int reconnects;
  private volatile String consumer = "";
  private volatile int partitions;

  Subscription(WindowClient client, SubscribeOptions options, DeliveryHandler handler) {
    this(client, options, handler, null);
  }

  Subscription(WindowClient client, SubscribeOptions options, BatchHandler batchHandler) {
    this(client, options, null, batchHandler);
  }

  private Subscription(
      WindowClient client,
      SubscribeOptions options,
      DeliveryHandler handler,
      BatchHandler batchHandler) {
    this.client = client;
    this.options = options;
    this.handler = handler;
    this.batchHandler = batchHandler;
    this.thread = new Thread(this::run, "window-subscription-" + options.describe());
  }

  void start() {
    thread.start();
  }

  /**
   * The error that ended the subscription, a {@link SubscriptionEndedException} (null while
   * running and after {@link #close}).
   */
  public Throwable error() {
    return error;
  }

  /** Streams opened after the first one (the resubscriptions). */
  public int reconnects() {
    return reconnects;
  }

  /** The consumer name the sidecar confirmed (empty before the first {@code opened}). */
  public String consumer() {
    return consumer;
  }

  /**
   * How many partitions of the partitioned stream the sidecar shares out among the group's
   * replicas for this subscription ({@code Opened.partitions}), once it is open: 0 before the first
   * {@code opened}, on an unpartitioned stream, a list or pub/sub, and from a sidecar older than
   * the field, which then reads the stream itself whatever {@link
   * SubscribeOptions.Builder#partitions} asked for. Its deliveries name their partition ({@link
   * Delivery#partition}).
   */
  public int partitions() {
    return partitions;
  }

  /** Whether the subscription has ended (closed, or failed for good: see {@link #error}). */
  public boolean isTerminated() {
    return terminated.getCount() == 0;
  }

  /** Waits until the subscription ends. */
  public void awaitTermination() throws InterruptedException {
    terminated.await();
  }

  /** Waits until the subscription ends, at most {@code timeout}; true if it has. */
  public boolean awaitTermination(Duration timeout) throws InterruptedException {
    return terminated.await(timeout.toMillis(), TimeUnit.MILLISECONDS);
  }

  /**
   * Ends the subscription: sends the outcomes already given (also of reads not completely
   * settled), half-closes the stream and waits (up to the close timeout) for the sidecar to flush
   * them. Deliveries without an outcome stay pending and are delivered again. From the handler's
   * own thread it only requests the close.
   */
  @Override
  public void close() {
    closeRequested.countDown();
    if (Thread.currentThread() == thread) {
      return;
    }
    try {
      terminated.await();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** Hands an error to the listener; its exceptions are logged, never the subscription's end. */
  void reportError(WindowException e) {
    listen(() -> options.listener.error(e));
  }

  void log(String format, Object... args) {
    if (LOG.isLoggable(Level.INFO)) {
      LOG.info(String.format(format, args));
    }
  }

  private boolean closing() {
    return closeRequested.getCount() == 0;
  }

  private void run() {
    try {
      Duration backoff = options.minBackoff;
      boolean everOpened = false;
      int failedOpens = 0;
      while (!closing()) {
        Throwable failure = null;
        Session s = null;
        try {
          s = open();
        } catch (StatusRuntimeException e) {
          failedOpens++;
          failure = WindowException.of("subscribe", client.address(), e, client.usesTls(), 0);
        }
        if (s != null) {
          failedOpens = 0;
          Opened opened = s.opened.getNow(null);
          if (everOpened) {
            int n = ++reconnects;
            log("subscription %s: resubscribed as consumer '%s'", options.describe(), consumer);
            listen(() -> options.listener.resubscribed(opened, n));
          } else {
            everOpened = true;
            listen(() -> options.listener.opened(opened));
          }
          backoff = options.minBackoff;
          if (serve(s)) {
            s.shutdown(options.closeTimeout);
            return;
          }
          failure = s.error();
          if (failure == null) {
            failure = Status.UNAVAILABLE.withDescription("the stream ended").asRuntimeException();
          }
        }
        if (!retryable(failure)
            || Probe.notTheSidecar(failure)
            || (options.maxAttempts > 0 && failedOpens >= options.maxAttempts)) {
          SubscriptionEndedException ended = new SubscriptionEndedException(failedOpens, failure);
          error = ended;
          log("subscription %s: %s", options.describe(), ended.getMessage());
          reportError(ended);
          return;
        }
        long half = Math.max(1, backoff.toMillis() / 2);
        long wait = half + ThreadLocalRandom.current().nextLong(half + 1);
        log(
            "subscription %s: %s; reconnecting in %d ms", options.describe(), describe(failure), wait);
        Throwable cause = failure;
        listen(() -> options.listener.disconnected(cause, Duration.ofMillis(wait)));
        if (closeRequested.await(wait, TimeUnit.MILLISECONDS)) {
          return;
        }
        backoff = backoff.multipliedBy(2);
        if (backoff.compareTo(options.maxBackoff) > 0) {
          backoff = options.maxBackoff;
        }
      }
    } catch (InterruptedException e) {
      error = e;
      Thread.currentThread().interrupt();
    } finally {
      terminated.countDown();
    }
  }

  /** Runs a listener method; its exceptions are logged, never the subscription's end. */
  private void listen(Runnable call) {
    try {
      call.run();
    } catch (RuntimeException e) {
      LOG.log(Level.WARNING, "the subscription listener failed", e);
    }
  }

  /** Calls the handler for the session's deliveries until it ends (false) or close (true). */
  private boolean serve(Session s) throws InterruptedException {
    while (true) {
      if (closing()) {
        return true;
      }
      Delivery d = s.inbox.poll(50, TimeUnit.MILLISECONDS);
      if (d == null) {
        if (s.isDead()) {
          return false;
        }
        continue;
      }
      if (!s.start(d)) {
        if (s.isDead()) {
          // Not handed out: its entry is pending and comes back on the next stream.
          return false;
        }
        continue; // not handed out either: the sidecar is draining
      }
      if (batchHandler != null) {
        handleBatch(s, d);
        continue;
      }
      Exception failure = null;
      try {
        handler.handle(d);
      } catch (Exception e) {
        LOG.log(Level.WARNING, "handler failed for " + d, e);
        failure = e;
      }
      finish(d, failure);
    }
  }

  /**
   * Hands {@code first} out with the rest of its read, which is queued right behind it (a read's
   * deliveries are queued together), to the batch handler.
   */
  private void handleBatch(Session s, Delivery first) {
    List<Delivery> ds = new ArrayList<>();
    ds.add(first);
    for (Delivery n = s.inbox.peek(); n != null && n.read == first.read; n = s.inbox.peek()) {
      if (!s.inbox.remove(n) || !s.start(n)) {
        // The inbox was cleared meanwhile (the stream ended, or the sidecar drains): the rest
        // is not handed out and comes back.
        break;
      }
      ds.add(n);
    }
    Exception failure = null;
    try {
      batchHandler.handle(new DeliveryBatch(first.read.id, first.read.partition, ds));
    } catch (Exception e) {
      LOG.log(Level.WARNING, "batch handler failed for read " + first.read.id, e);
      failure = e;
    }
    for (Delivery d : ds) {
      finish(d, failure);
    }
  }

  /**
   * The rule for what a handler left without an outcome: acked when it returned (a handler that
   * only queues commands), unless settled later; retried after the growing delay when it threw.
   */
  private void finish(Delivery d, Exception failure) {
    try {
      if (failure == null) {
        if (!d.later && !d.isSettled()) {
          d.ack();
        }
      } else if (!d.isSettled()) {
        d.retryAfter(options.retryDelay(d.deliveryCount()), "handler failed: " + failure);
      }
    } catch (IllegalStateException | AlreadySettledException raced) {
      // settled meanwhile from another thread
    }
  }

  private Session open() throws InterruptedException {
    Session s = new Session(this);
    client.async.subscribe(s);
    s.send(SubscribeRequest.newBuilder().setOpen(options.toOpen()).build());
    try {
      Opened opened = s.opened.get(options.openTimeout.toMillis(), TimeUnit.MILLISECONDS);
      consumer = opened.getConsumer();
      partitions = opened.getPartitions();
      return s;
    } catch (TimeoutException e) {
      s.cancel("no opened in time");
      throw Status.DEADLINE_EXCEEDED
          .withDescription("no `opened` from the sidecar within " + options.openTimeout)
          .asRuntimeException();
    } catch (ExecutionException e) {
      throw Status.fromThrowable(e.getCause()).asRuntimeException();
    }
  }

  /** Whether a new stream may succeed where this one failed. */
  static boolean retryable(Throwable t) {
    return switch (Status.fromThrowable(t).getCode()) {
      case UNAVAILABLE, // the sidecar is shutting down or unreachable, or Redis is
          ALREADY_EXISTS, // our consumer name is still held by the previous stream
          ABORTED,
          RESOURCE_EXHAUSTED,
          DEADLINE_EXCEEDED,
          INTERNAL,
          UNKNOWN,
          CANCELLED -> true; // broken connections surface as these
      default -> false; // INVALID_ARGUMENT, FAILED_PRECONDITION...: fix the request
    };
  }

  private static String describe(Throwable t) {
    if (t instanceof WindowException) {
      return t.getMessage();
    }
    Status st = Status.fromThrowable(t);
    return st.getCode() + ": " + st.getDescription();
  }
}
