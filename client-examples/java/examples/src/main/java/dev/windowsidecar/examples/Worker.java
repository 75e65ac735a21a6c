package dev.windowsidecar.examples;

import dev.windowsidecar.client.Delivery;
import dev.windowsidecar.client.DeliveryHandler;
import dev.windowsidecar.client.Flush;
import dev.windowsidecar.client.RejectedOutcome;
import dev.windowsidecar.client.SubscribeOptions;
import dev.windowsidecar.client.Subscription;
import dev.windowsidecar.client.WindowClient;
import dev.windowsidecar.v1.OutcomeKind;
import java.nio.file.Path;
import java.time.Duration;
import java.time.LocalTime;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The order service: consumes the {@code orders} stream through the sidecar.
 *
 * <p>For each order: an invalid one (no lines, or a line with qty <= 0) is dropped; a flaky one
 * on its first delivery is retried after a delay; otherwise it queues, per line, {@code LPUSH
 * picks "<id>:<sku>:<qty>"} and {@code HINCRBY sku-totals <sku> <qty>}, and acks. The side
 * effects run in Redis only for acked orders, together with the XACK of their read. A {@code
 * "poison"} order also queues {@code FLUSHALL}, which the sidecar refuses: by default the helper
 * drops it at once (no retry fixes FORBIDDEN_COMMAND); with {@code --rejected-outcome retry_after}
 * it retries it after 1 s, and with {@code --max-deliveries N --dead-letter KEY} it ends in the
 * dead letter.
 *
 * <p>It exits when every order is settled for good (acked + dropped == number of orders, counted
 * from the sidecar's flush reports), or after {@code --idle-timeout} without a delivery.
 *
 * <p>Flags: {@code --addr} (host:port or unix:PATH; env WINDOW_SIDECAR_ADDR, default
 * 127.0.0.1:50051), {@code --consumer} (env WINDOW_CONSUMER, default worker-1), {@code --stream
 * orders}, {@code --group order-service}, {@code --count 16}, {@code --orders ../orders.json},
 * {@code --expect N} (0: as many as in --orders; -1: until idle), {@code --retry-delay 200ms},
 * {@code --idle-timeout 30s}, {@code --work-time 0ms} (simulated handling time per order),
 * {@code --max-deliveries 0} and {@code --dead-letter KEY} (the delivery cap and where entries past
 * it go), {@code --atomic false} (each order's commands and XACK in one script), {@code
 * --rejected-outcome auto} (auto, drop or retry_after: how the helper settles a delivery whose
 * command the sidecar refused), {@code --batches false} (a read at a time: drops and retries per
 * order, the rest acked with one {@code batch.ack()}).
 */
public final class Worker {
  private Worker() {}

  public static void main(String[] argv) throws Exception {
    System.setProperty(
        "java.util.logging.SimpleFormatter.format", "%1$tT.%1$tL window: %5$s%6$s%n");
    Args args = new Args(argv);
    String addr = args.get("addr", Args.env("WINDOW_SIDECAR_ADDR", "127.0.0.1:50051"));
    String consumer = args.get("consumer", Args.env("WINDOW_CONSUMER", "worker-1"));
    String stream = args.get("stream", "orders");
    String group = args.get("group", "order-service");
    int count = args.getInt("count", 16);
    String ordersPath = args.get("orders", "../orders.json");
    int expect = args.getInt("expect", 0);
    Duration retryDelay = args.getDuration("retry-delay", Duration.ofMillis(200));
    Duration idleTimeout = args.getDuration("idle-timeout", Duration.ofSeconds(30));
    Duration workTime = args.getDuration("work-time", Duration.ZERO);
    int maxDeliveries = args.getInt("max-deliveries", 0);
    String deadLetter = args.get("dead-letter", "");
    boolean atomic = Boolean.parseBoolean(args.get("atomic", "false"));
    boolean batches = Boolean.parseBoolean(args.get("batches", "false"));
    RejectedOutcome rejectedOutcome =
        RejectedOutcome.valueOf(args.get("rejected-outcome", "auto").toUpperCase(java.util.Locale.ROOT));
    args.done();

    int want = expect != 0 ? expect : Orders.load(Path.of(ordersPath)).payloads().size();
    Tally tally = new Tally(want);
    // When the last delivery came, for the idle timeout: set by the handlers' threads.
    AtomicLong lastDelivery = new AtomicLong(System.nanoTime());

    int exit = 0;
    try (WindowClient client = WindowClient.connect(addr)) {
      SubscribeOptions.Builder builder =
          SubscribeOptions.builder(stream, group)
              .consumer(consumer)
              .count(count)
              .atomic(atomic)
              .rejectedOutcome(rejectedOutcome)
              .onFlush(tally::flushed);
      if (maxDeliveries > 0) {
        builder.deadLetter(maxDeliveries, deadLetter);
      }
      SubscribeOptions options = builder.build();
      DeliveryHandler handler =
          d -> {
            lastDelivery.set(System.nanoTime());
            if (!workTime.isZero()) {
              Thread.sleep(workTime.toMillis());
            }
            handle(d, retryDelay, true);
          };
      Subscription sub =
          batches
              ? client.subscribeBatches(
                  options,
                  batch -> {
                    for (Delivery d : batch) {
                      lastDelivery.set(System.nanoTime());
                      handle(d, retryDelay, false);
                    }
                    batch.ack(); // the rest, with their commands
                  })
              : client.subscribe(options, handler);
      // Ctrl-C (SIGINT) and SIGTERM start the JVM's shutdown: this hook ends the loop below and
      // waits (bounded) until the subscription is closed, so that what is settled is flushed and
      // the summary printed, without a stack trace.
      Thread hook =
          new Thread(
              () -> {
                log("interrupted: stopping; what is settled is flushed");
                interrupted.countDown();
                try {
                  finished.await(20, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                  Thread.currentThread().interrupt();
                }
              },
              "worker-shutdown");
      Runtime.getRuntime().addShutdownHook(hook);
      log(
          "consuming %s as %s/%s via %s, %s",
          stream, group, consumer, addr, want > 0 ? "until " + want + " orders are settled" : "until idle");
      while (true) {
        if (tally.done.await(100, TimeUnit.MILLISECONDS)) {
          break;
        }
        if (interrupted.getCount() == 0) {
          break;
        }
        if (sub.isTerminated()) {
          log("subscription ended: %s", sub.error());
          exit = 1;
          break;
        }
        long idle = System.nanoTime() - lastDelivery.get();
        if (idle > idleTimeout.toNanos()) {
          if (want > 0) {
            log("idle for %s before every order was settled", idleTimeout);
            exit = 2;
          } else {
            log("idle for %s: done", idleTimeout);
          }
          break;
        }
      }
      sub.close();
      int[] c = tally.counts();
      System.out.printf(
          "summary: acked=%d dropped=%d retried=%d reconnects=%d%n", c[0], c[1], c[2], sub.reconnects());
      System.out.flush();
      if (interrupted.getCount() == 0) {
        // The JVM is already shutting down (System.exit here would wait for the hook forever).
        finished.countDown();
        return;
      }
      Runtime.getRuntime().removeShutdownHook(hook);
    }
    System.exit(exit);
  }

  /** Counted down by the shutdown hook on Ctrl-C or SIGTERM. */
  private static final CountDownLatch interrupted = new CountDownLatch(1);

  /** Counted down once the subscription is closed after {@link #interrupted}. */
  private static final CountDownLatch finished = new CountDownLatch(1);

  /** Decides one delivery; an ack is left to its batch unless {@code ackNow}. */
  static void handle(Delivery d, Duration retryDelay, boolean ackNow) {
    Orders.Order o;
    try {
      o = Orders.parse(d.payloadUtf8());
    } catch (RuntimeException e) {
      report(d, "?", "drop", d.drop("payload is not an order: " + e.getMessage()));
      return;
    }
    String invalid = o.invalid();
    if (invalid != null) {
      report(d, o.id, "drop (" + invalid + ")", d.drop(invalid));
      return;
    }
    if (o.flaky && d.deliveryCount() == 1) {
      report(
          d,
          o.id,
          "retry_after " + retryDelay.toMillis() + "ms",
          d.retryAfter(retryDelay, "flaky: first attempt fails"));
      return;
    }
    for (Orders.Line l : o.lines) {
      // The typed command API (generated from Redis's command specification): a misspelled
      // name or a wrong argument type does not compile.
      d.redis().lpush("picks", o.id + ":" + l.sku + ":" + l.qty).hincrby("sku-totals", l.sku, l.qty);
    }
    if (o.poison) {
      // Refused by the sidecar (FORBIDDEN_COMMAND): the helper drops the delivery at once, or with
      // --rejected-outcome retry_after retries it until the cap sends it to the dead letter.
      d.queue("FLUSHALL");
    }
    report(d, o.id, "ack (" + o.lines.size() + " lines)", !ackNow || d.ack());
  }

  private static void report(Delivery d, String id, String what, boolean sent) {
    if (sent) {
      log("%s %s (delivery %d) -> %s", id, d.entryId(), d.deliveryCount(), what);
    } else {
      log(
          "%s %s (delivery %d): %s not sent: its stream is gone, the entry will come back",
          id, d.entryId(), d.deliveryCount(), what);
    }
  }

  static void log(String format, Object... args) {
    System.err.printf("%s worker: %s%n", LocalTime.now(), String.format(format, args));
  }

  /** Outcomes confirmed by the sidecar's flush reports, once per order. */
  static final class Tally {
    private final int want;
    private final Map<String, OutcomeKind> finalOutcomes = new HashMap<>();
    private int retried;
    final CountDownLatch done = new CountDownLatch(1);

    Tally(int want) {
      this.want = want;
    }

    synchronized void flushed(Flush f) {
      if (!f.report().getOk() && f.report().getSettleFailed()) {
        return; // still pending: they come back
      }
      for (Delivery d : f.settled()) {
        String key = d.entryId();
        try {
          Orders.Order o = Orders.parse(d.payloadUtf8());
          if (o.id != null && !o.id.isEmpty()) {
            key = o.id;
          }
        } catch (RuntimeException e) {
          // keyed by entry id
        }
        OutcomeKind kind = d.outcome();
        switch (kind) {
          case OUTCOME_KIND_ACK, OUTCOME_KIND_DROP -> {
            OutcomeKind prev = finalOutcomes.putIfAbsent(key, kind);
            if (prev != null) {
              log("%s settled again (%s, before %s): delivered more than once", key, kind, prev);
            }
          }
          case OUTCOME_KIND_RETRY, OUTCOME_KIND_RETRY_AFTER -> retried++;
          default -> {}
        }
      }
      if (want > 0 && finalOutcomes.size() >= want) {
        done.countDown();
      }
    }

    /** acked, dropped, retried. */
    synchronized int[] counts() {
      int acked = 0;
      int dropped = 0;
      for (OutcomeKind k : finalOutcomes.values()) {
        if (k == OutcomeKind.OUTCOME_KIND_ACK) {
          acked++;
        } else {
          dropped++;
        }
      }
      return new int[] {acked, dropped, retried};
    }
  }
}
