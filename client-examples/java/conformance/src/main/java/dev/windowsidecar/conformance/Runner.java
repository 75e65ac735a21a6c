package dev.windowsidecar.conformance;

import com.google.gson.Gson;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.windowsidecar.client.AlreadySettledException;
import dev.windowsidecar.client.ConnectionException;
import dev.windowsidecar.client.Delivery;
import dev.windowsidecar.client.RedisCommands;
import dev.windowsidecar.client.RejectedException;
import dev.windowsidecar.client.RequeueRefusedException;
import dev.windowsidecar.client.SideEffectException;
import dev.windowsidecar.client.RejectedOutcome;
import dev.windowsidecar.client.SubscriptionEndedException;
import dev.windowsidecar.client.WindowException;
import dev.windowsidecar.client.PublishTarget;
import dev.windowsidecar.client.SubscribeOptions;
import dev.windowsidecar.client.Subscription;
import dev.windowsidecar.client.SubscriptionListener;
import dev.windowsidecar.client.WindowClient;
import dev.windowsidecar.client.WindowClient.Message;
import dev.windowsidecar.v1.Opened;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * The Java client's conformance runner: plays the worker side of one scenario of
 * client-examples/conformance/scenarios with the window-sidecar-client package and prints what it
 * sees as JSON lines (see client-examples/conformance/README.md). The sidecar's address and
 * credentials come from the environment, read by the client ({@link WindowClient#connect()}).
 */
public final class Runner {
  private static final Gson GSON = new Gson();

  private final Map<String, List<String>> handle = new HashMap<>();
  /** How many times each payload was delivered; replicas' handlers run concurrently. */
  private final Map<String, Integer> seen = new ConcurrentHashMap<>();
  /** Each delivery's name (its payload, or the id field of an entry without the payload layout). */
  private final Map<Delivery, String> names = new java.util.concurrent.ConcurrentHashMap<>();
  private final String effects;
  private final boolean typed;
  /** {@code hold_until:P}: completed once the delivery named P is acked. */
  private final Map<String, CompletableFuture<Void>> acked = new ConcurrentHashMap<>();

  private CompletableFuture<Void> acked(String name) {
    return acked.computeIfAbsent(name, k -> new CompletableFuture<>());
  }

  /**
   * The line before an outcome the runner gives (run.sh checks the order with it); {@code
   * consumer} names the replica with {@code open.consumers}, else null.
   */
  private static void settle(Delivery d, String payload, String consumer) {
    Map<String, Object> f = new LinkedHashMap<>();
    f.put("payload", payload);
    f.put("count", d.deliveryCount());
    if (consumer != null) {
      f.put("consumer", consumer);
    }
    emit("settle", f);
  }

  private Runner(JsonObject scenario) {
    for (Map.Entry<String, JsonElement> e : scenario.getAsJsonObject("handle").entrySet()) {
      List<String> actions = new ArrayList<>();
      e.getValue().getAsJsonArray().forEach(a -> actions.add(a.getAsString()));
      handle.put(e.getKey(), actions);
    }
    effects = scenario.get("effects").getAsString();
    typed = "typed".equals(str(scenario, "side_effect"));
  }

  static synchronized void emit(String event, Map<String, Object> fields) {
    Map<String, Object> line = new LinkedHashMap<>();
    line.put("event", event);
    line.putAll(fields);
    System.out.println(GSON.toJson(line));
    System.out.flush();
  }

  static void emit(String event) {
    emit(event, Map.of());
  }

  public static void main(String[] argv) throws Exception {
    JsonObject scenario = JsonParser.parseString(Files.readString(Path.of(argv[0]))).getAsJsonObject();
    JsonObject open = scenario.getAsJsonObject("open");
    Runner runner = new Runner(scenario);
    if (!expectedErrors(scenario).isEmpty()) {
      closedSidecar(scenario);
      System.exit(0);
    }
    // `open.consumers`: replicas of one group, each a subscription on a connection of its own
    // as separate processes would have, all handled here, their lines naming the consumer; else
    // the one `open.consumer`.
    List<String> replicas = new ArrayList<>();
    if (open.has("consumers")) {
      open.getAsJsonArray("consumers").forEach(c -> replicas.add(c.getAsString()));
    }
    boolean several = !replicas.isEmpty();
    if (!several) {
      replicas.add(str(open, "consumer"));
    }
    CountDownLatch opened = new CountDownLatch(replicas.size());
    SubscriptionListener listener = runner.listener(opened);
    List<WindowClient> clients = new ArrayList<>();
    List<Subscription> subs = new ArrayList<>();
    for (String consumer : replicas) {
      WindowClient client = WindowClient.connect();
      clients.add(client);
      String named = several ? consumer : null;
      subs.add(client.subscribe(options(open, consumer, listener).build(), d -> runner.handle(d, named)));
    }
    // SIGTERM: stop consuming, send what is settled, close, and exit 0.
    Runtime.getRuntime()
        .addShutdownHook(
            new Thread(
                () -> {
                  // At once: each waits for its sidecar's flush, and run.sh allows 10 s in all.
                  subs.parallelStream().forEach(Subscription::close);
                  clients.forEach(WindowClient::close);
                  System.out.flush();
                  Runtime.getRuntime().halt(subs.stream().allMatch(sub -> sub.error() == null) ? 0 : 1);
                },
                "conformance-stop"));

    while (!opened.await(50, TimeUnit.MILLISECONDS)) {
      for (Subscription sub : subs) {
        if (sub.isTerminated()) {
          System.err.println("the subscription ended before it opened: " + sub.error());
          System.exit(1);
        }
      }
    }
    emit("opened");
    List<Message> messages = new ArrayList<>();
    for (JsonElement e : scenario.getAsJsonArray("publish")) {
      JsonObject entry = e.getAsJsonObject();
      Map<String, String> headers = new LinkedHashMap<>();
      if (entry.has("headers")) {
        entry.getAsJsonObject("headers").entrySet().forEach(h -> headers.put(h.getKey(), h.getValue().getAsString()));
      }
      messages.add(Message.of(entry.get("payload").getAsString(), headers));
    }
    clients.get(0).publish(target(scenario), messages, publishDeadline(scenario)).join();
    emit("published", Map.of("count", messages.size()));
    for (Subscription sub : subs) {
      sub.awaitTermination();
      if (sub.error() != null) {
        System.err.println("the subscription failed: " + sub.error());
        System.exit(1);
      }
    }
  }

  /** The error callback's lines; {@code opened} counts the subscriptions' first opens down. */
  private SubscriptionListener listener(CountDownLatch opened) {
    return new SubscriptionListener() {
      @Override
      public void opened(Opened o) {
        opened.countDown();
      }

      @Override
      public void resubscribed(Opened o, int reconnects) {
        emit("resubscribed");
      }

      @Override
      public void draining(Duration grace, int outstanding) {
        emit("draining");
      }

      @Override
      public void error(WindowException e) {
        if (e instanceof RejectedException r) {
          Map<String, Object> f = new LinkedHashMap<>();
          f.put("payload", r.delivery() == null ? "" : names.getOrDefault(r.delivery(), ""));
          f.put("reason", r.reason());
          f.put("error", errorClass(e));
          f.put("message", e.getMessage());
          emit("rejected", f);
        } else if (e instanceof SideEffectException s) {
          Map<String, Object> f = new LinkedHashMap<>();
          f.put("payload", s.delivery() == null ? "" : names.getOrDefault(s.delivery(), ""));
          f.put("command", s.command());
          f.put("settled", s.settled());
          f.put("error", errorClass(e));
          f.put("message", e.getMessage());
          emit("side_effect_error", f);
        } else if (e instanceof RequeueRefusedException q) {
          Map<String, Object> f = new LinkedHashMap<>();
          f.put("payload", q.delivery() == null ? "" : names.getOrDefault(q.delivery(), ""));
          f.put("error", errorClass(e));
          f.put("message", e.getMessage());
          emit("requeue_refused", f);
        }
      }
    };
  }

  /** The subscription {@code open} describes, as {@code consumer}. */
  private static SubscribeOptions.Builder options(
      JsonObject open, String consumer, SubscriptionListener listener) {
    String key = open.get("key").getAsString();
    String form = open.get("form").getAsString();
    SubscribeOptions.Builder b =
        switch (form) {
          case "stream" -> SubscribeOptions.builder(key, str(open, "group")).consumer(consumer);
          case "reliable_list" -> SubscribeOptions.reliableList(key).consumer(consumer);
          case "simple_list" -> SubscribeOptions.simpleList(key);
          case "pubsub" -> SubscribeOptions.pubsub().channels(key);
          default -> throw new IllegalArgumentException("unknown form " + form);
        };
    if (open.has("count")) {
      b.count(open.get("count").getAsInt());
    }
    if (open.has("max_in_flight")) {
      b.maxInFlight(open.get("max_in_flight").getAsInt());
    }
    if (open.has("ordering_header")) {
      b.orderingHeader(str(open, "ordering_header"));
    }
    if (open.has("ordering_field")) {
      b.orderingField(str(open, "ordering_field"));
    }
    if (open.has("partitions")) {
      b.partitions(open.get("partitions").getAsInt());
    }
    if ("atomic".equals(str(open, "mode"))) {
      b.atomic(true);
    }
    if (open.has("max_deliveries")) {
      b.deadLetter(open.get("max_deliveries").getAsInt(), str(open, "dead_letter"));
    }
    b.reportsInReads(bool(open, "reports_in_reads")).packedAcks(bool(open, "packed_acks"));
    b.rejectedOutcome(rejectedOutcome(str(open, "rejected_outcome")));
    if (open.has("max_attempts")) {
      b.maxAttempts(open.get("max_attempts").getAsInt());
    }
    return b.listener(listener);
  }

  /**
   * Where the runner publishes: the form's target; a stream's partitions by the key of {@code
   * publish_partitions} ({@code {"partitions": N, "header": H}} or {@code "field": F}).
   */
  private static PublishTarget target(JsonObject scenario) {
    JsonObject open = scenario.getAsJsonObject("open");
    String key = open.get("key").getAsString();
    PublishTarget target =
        switch (open.get("form").getAsString()) {
          case "stream" -> PublishTarget.stream(key);
          case "reliable_list", "simple_list" -> PublishTarget.list(key);
          case "pubsub" -> PublishTarget.channel(key);
          default -> throw new IllegalArgumentException("unknown form " + open.get("form"));
        };
    if (!scenario.has("publish_partitions")) {
      return target;
    }
    JsonObject by = scenario.getAsJsonObject("publish_partitions");
    if (by.has("header") == by.has("field")) {
      throw new IllegalArgumentException("publish_partitions names a header or a field: " + by);
    }
    int partitions = by.get("partitions").getAsInt();
    return by.has("header")
        ? target.withPartitionsByHeader(partitions, str(by, "header"))
        : target.withPartitionsByField(partitions, str(by, "field"));
  }

  private static String str(JsonObject o, String name) {
    return o.has(name) ? o.get(name).getAsString() : "";
  }

  private static boolean bool(JsonObject o, String name) {
    return o.has(name) && o.get(name).getAsBoolean();
  }

  /** The n-th delivery of a payload takes the n-th action of its list; past the end, the last. */
  private String actionFor(String payload, int n) {
    List<String> actions = handle.getOrDefault(payload, handle.getOrDefault("*", List.of("ack")));
    return actions.get(Math.min(n, actions.size()) - 1);
  }

  /** One delivery; {@code consumer} names its replica with {@code open.consumers}, else null. */
  private void handle(Delivery d, String consumer) throws Exception {
    String payload = d.payloadUtf8();
    Map<String, Object> fields = new LinkedHashMap<>();
    if (!d.hasPayload()) {
      // An entry another producer wrote with plain fields: named by its id field.
      payload = d.textFields().getOrDefault("id", "");
      String jsonError = null;
      try {
        d.json(Object.class);
      } catch (WindowException e) {
        jsonError = e.getMessage();
      }
      fields.put("fields", new LinkedHashMap<>(d.textFields()));
      fields.put("json_error", jsonError);
    }
    names.put(d, payload);
    int n = seen.merge(payload, 1, Integer::sum);
    fields.put("payload", payload);
    fields.put("count", d.deliveryCount());
    fields.put("headers", new LinkedHashMap<>(d.headers()));
    if (consumer != null) {
      fields.put("consumer", consumer);
    }
    d.partition().ifPresent(p -> fields.put("partition", p));
    emit("delivery", fields);
    String action = actionFor(payload, n);
    if (typed) {
      d.redis().hincrby(effects, payload, 1);
    } else {
      d.queue("HINCRBY", effects, payload, 1);
    }
    if (action.equals("ack")) {
      settle(d, payload, consumer);
      d.ack();
      acked(payload).complete(null);
    } else if (action.equals("drop")) {
      settle(d, payload, consumer);
      d.drop("the scenario drops it");
    } else if (action.equals("retry")) {
      settle(d, payload, consumer);
      d.retry("the scenario retries it");
    } else if (action.equals("dead_letter")) {
      settle(d, payload, consumer);
      d.deadLetter("conformance: dead_letter");
    } else if (action.startsWith("retry_after:")) {
      settle(d, payload, consumer);
      d.retryAfter(Duration.ofMillis(millis(action)), "the scenario retries it later");
    } else if (action.startsWith("hold_until:")) {
      // Unsettled until that delivery is acked; the handler returns and the others go on.
      String name = payload;
      d.settleLater();
      acked(action.substring(action.indexOf(':') + 1))
          .thenRun(
              () -> {
                settle(d, name, consumer);
                d.ack();
                acked(name).complete(null);
              });
    } else if (action.equals("reject") || action.startsWith("reject:")) {
      // A command the sidecar refuses (FLUSHALL, or the one named): the client's rule applies.
      String[] words =
          action.equals("reject")
              ? new String[] {"FLUSHALL"}
              : action.substring("reject:".length()).split(" ");
      d.queue(words[0], (Object[]) java.util.Arrays.copyOfRange(words, 1, words.length));
      d.ack();
    } else if (action.startsWith("queue:")) {
      // A command the sidecar accepts and Redis may fail when it runs, then an ack.
      String[] words = action.substring("queue:".length()).split(" ");
      d.queue(words[0], (Object[]) java.util.Arrays.copyOfRange(words, 1, words.length));
      settle(d, payload, consumer);
      d.ack();
      acked(payload).complete(null);
    } else if (action.equals("fail")) {
      throw new IllegalStateException("the scenario's handler fails");
    } else if (action.equals("typo")) {
      // A literal d.redis().hincrbyy(...) does not compile; looked up by a name known only at run
      // time (reflection), the misspelled command is no method: the call fails here, in the
      // handler, and nothing reaches the sidecar.
      try {
        RedisCommands.class
            .getMethod("hincrbyy", String.class, Object.class, long.class)
            .invoke(d.redis(), effects, payload, 1L);
      } catch (NoSuchMethodException e) {
        Map<String, Object> f = new LinkedHashMap<>();
        f.put("payload", payload);
        f.put(
            "message",
            "RedisCommands has no method hincrbyy: Redis "
                + RedisCommands.REDIS_SPEC_VERSION
                + " has no command HINCRBYY (a literal d.redis().hincrbyy(...) does not compile)");
        emit("call_error", f);
      }
      d.ack();
    } else if (action.startsWith("slow_ack:")) {
      Thread.sleep(millis(action));
      // Its settle line too, so that a slow key's order can be checked like any other's.
      settle(d, payload, consumer);
      d.ack();
    } else {
      throw new IllegalArgumentException("unknown action " + action);
    }
  }

  private static long millis(String action) {
    return Long.parseLong(action.substring(action.indexOf(':') + 1));
  }

  private static RejectedOutcome rejectedOutcome(String s) {
    return switch (s) {
      case "", "auto" -> RejectedOutcome.AUTO;
      case "drop" -> RejectedOutcome.DROP;
      case "retry_after" -> RejectedOutcome.RETRY_AFTER;
      default -> throw new IllegalArgumentException("unknown rejected_outcome " + s);
    };
  }

  /** The vocabulary's name of one of the client's exceptions. */
  static String errorClass(Throwable t) {
    if (t instanceof java.util.concurrent.CompletionException && t.getCause() != null) {
      t = t.getCause();
    }
    if (t instanceof SubscriptionEndedException) {
      return "SubscriptionEndedError";
    }
    if (t instanceof ConnectionException) {
      return "ConnectionError";
    }
    if (t instanceof dev.windowsidecar.client.RedisUnavailableException) {
      return "RedisUnavailableError";
    }
    if (t instanceof dev.windowsidecar.client.RefusedException) {
      return "RefusedError";
    }
    if (t instanceof dev.windowsidecar.client.CallTimeoutException) {
      return "CallTimeoutError";
    }
    if (t instanceof RejectedException) {
      return "RejectedError";
    }
    if (t instanceof SideEffectException) {
      return "SideEffectError";
    }
    if (t instanceof RequeueRefusedException) {
      return "RequeueRefusedError";
    }
    if (t instanceof AlreadySettledException) {
      return "AlreadySettledError";
    }
    if (t instanceof WindowException) {
      return "WindowError";
    }
    return t.getClass().getName();
  }

  /**
   * A scenario with no sidecar at the address: one publish, then a subscription that must give
   * up; each failure printed as an error line.
   */
  private static void closedSidecar(JsonObject scenario) throws Exception {
    JsonObject open = scenario.getAsJsonObject("open");
    String key = open.get("key").getAsString();
    List<Message> messages = new ArrayList<>();
    for (JsonElement e : scenario.getAsJsonArray("publish")) {
      messages.add(Message.of(e.getAsJsonObject().get("payload").getAsString()));
    }
    java.util.Set<String> calls = expectedErrors(scenario);
    long began = System.nanoTime();
    WindowClient made;
    try {
      made = WindowClient.connect();
    } catch (WindowException e) {
      failed("connect", e, began);
      return;
    }
    try (WindowClient client = made) {
      if (calls.contains("publish")) {
        began = System.nanoTime();
        Throwable failure = null;
        try {
          client.publish(PublishTarget.stream(key), messages, publishDeadline(scenario)).join();
        } catch (RuntimeException e) {
          failure = e instanceof java.util.concurrent.CompletionException ? e.getCause() : e;
        }
        failed("publish", failure, began);
      }
      if (!calls.contains("subscribe")) {
        return;
      }
      java.util.concurrent.LinkedBlockingQueue<WindowException> errors =
          new java.util.concurrent.LinkedBlockingQueue<>();
      SubscribeOptions.Builder b =
          SubscribeOptions.builder(key, str(open, "group"))
              .consumer(str(open, "consumer"))
              .listener(
                  new SubscriptionListener() {
                    @Override
                    public void error(WindowException e) {
                      errors.add(e);
                    }
                  });
      if (open.has("max_attempts")) {
        b.maxAttempts(open.get("max_attempts").getAsInt());
      }
      began = System.nanoTime();
      Subscription sub = client.subscribe(b.build(), d -> d.ack());
      sub.awaitTermination();
      WindowException reported = errors.poll();
      failed("subscribe", reported != null ? reported : sub.error(), began);
    }
  }

  /**
   * The publish call's deadline: the scenario's {@code publish_timeout_ms}, else the client's
   * default ({@link WindowClient#PUBLISH_DEADLINE_MS}).
   */
  private static Duration publishDeadline(JsonObject scenario) {
    return Duration.ofMillis(
        scenario.has("publish_timeout_ms")
            ? scenario.get("publish_timeout_ms").getAsLong()
            : WindowClient.PUBLISH_DEADLINE_MS);
  }

  /** The calls the scenario expects to fail ({@code expect.errors}), by name. */
  private static java.util.Set<String> expectedErrors(JsonObject scenario) {
    java.util.Set<String> calls = new java.util.HashSet<>();
    if (scenario.has("expect") && scenario.getAsJsonObject("expect").has("errors")) {
      for (JsonElement e : scenario.getAsJsonObject("expect").getAsJsonArray("errors")) {
        calls.add(e.getAsJsonObject().get("call").getAsString());
      }
    }
    return calls;
  }

  private static void failed(String call, Throwable t, long began) {
    Map<String, Object> f = new LinkedHashMap<>();
    f.put("call", call);
    f.put("error", t == null ? "none" : errorClass(t));
    f.put("message", t == null ? "" : t.getMessage());
    f.put("elapsed_ms", (System.nanoTime() - began) / 1_000_000);
    if (t != null) {
      System.err.println(call + ": " + t);
    }
    emit("error", f);
  }
}
