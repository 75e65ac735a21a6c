package dev.windowsidecar.client;

import com.google.protobuf.ByteString;
import dev.windowsidecar.v1.Field;
import dev.windowsidecar.v1.Outcome;
import dev.windowsidecar.v1.OutcomeKind;
import dev.windowsidecar.v1.QueuedCommand;
import dev.windowsidecar.v1.TraceContext;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.OptionalInt;

/**
 * One stream entry handed to the application. Queue commands for it, then settle it exactly once.
 * Thread-safe.
 *
 * <p>The outcome methods return {@code true} when the outcome will reach the sidecar, {@code
 * false} when the stream that delivered this entry is gone (the sidecar restarted, the connection
 * broke, the subscription closed): nothing is sent, the entry stays pending in Redis and is
 * delivered again on the next stream. A second outcome throws {@link AlreadySettledException}.
 *
 * <p>An entry in the payload layout (what the clients publish) has a {@link #payload()}, read with
 * {@link #text()} or {@link #json(Class)}; one another producer wrote with plain fields ({@code
 * XADD k * sku apple qty 2}) has {@link #fields()} / {@link #textFields()} instead.
 */
public final class Delivery {
  private final dev.windowsidecar.v1.Delivery proto;
  final Session session;
  final Session.ReadState read;
  // Guarded by session.lock.
  List<QueuedCommand> commands = new ArrayList<>();
  Outcome outcome;
  boolean sent;
  /**
   * Done for its read: a flush report of its read came after its outcome was sent, or the sidecar
   * answered that outcome ALREADY_SETTLED (its slot is no longer outstanding there: no report
   * ever names it).
   */
  boolean reported;
  boolean started; // handed to the application's handler and not settled yet
  /** The application's own trace context for handling this delivery, sent with its outcome. */
  TraceContext handlingTrace;
  /** The sidecar's refusal of one of its commands, kept to explain the refused ack after it. */
  dev.windowsidecar.v1.Rejection rejection;
  /** The handler's return does not ack it: the application settles it later ({@link #settleLater}). */
  volatile boolean later;

  Delivery(dev.windowsidecar.v1.Delivery proto, Session session, Session.ReadState read) {
    this.proto = proto;
    this.session = session;
    this.read = read;
  }

  /** The sidecar's id for this delivery within its stream. */
  public long slot() {
    return proto.getSlot();
  }

  /** The Redis entry id. */
  public String entryId() {
    return proto.getEntryId();
  }

  /** The payload (payload-and-headers layout, what {@link WindowClient#publish} writes). */
  public ByteString payload() {
    return proto.getPayload();
  }

  /** The payload as UTF-8 text (empty for an entry not in the payload layout). */
  public String payloadUtf8() {
    return proto.getPayload().toStringUtf8();
  }

  /** Whether the entry is in the payload layout; false for one written with plain fields. */
  public boolean hasPayload() {
    return proto.getFieldsCount() == 0;
  }

  /**
   * The payload as UTF-8 text.
   *
   * @throws WindowException for an entry not in the payload layout, naming its fields (read
   *     {@link #fields()} or {@link #textFields()} instead)
   */
  public String text() {
    if (!hasPayload()) {
      throw noPayload("text()");
    }
    return proto.getPayload().toStringUtf8();
  }

  /**
   * The payload decoded as JSON into {@code type} (Gson, the JSON library grpc-java depends on).
   *
   * @throws WindowException for an entry not in the payload layout, naming its fields (read
   *     {@link #fields()} or {@link #textFields()} instead), or when the payload is not JSON of
   *     that type
   */
  public <T> T json(Class<T> type) {
    if (!hasPayload()) {
      throw noPayload("json()");
    }
    try {
      return new com.google.gson.Gson().fromJson(proto.getPayload().toStringUtf8(), type);
    } catch (com.google.gson.JsonParseException e) {
      throw new WindowException("the payload of entry " + entryId() + " is not JSON of " + type.getSimpleName() + ": " + e.getMessage());
    }
  }

  private WindowException noPayload(String call) {
    List<String> names = new ArrayList<>();
    for (Field f : proto.getFieldsList()) {
      names.add(f.getName().toStringUtf8());
    }
    return new WindowException(
        call
            + ": entry "
            + entryId()
            + " is not in the payload layout (no _payload field; another producer wrote it with"
            + " plain fields "
            + String.join(", ", names)
            + "): read fields() or textFields() instead");
  }

  /** The headers, by name without the {@code h:} prefix. */
  public Map<String, String> headers() {
    return proto.getHeadersMap();
  }

  /**
   * An entry not in the payload layout: its fields by name (the last value of a repeated name),
   * in order; empty for an entry in the layout.
   */
  public Map<String, ByteString> fields() {
    Map<String, ByteString> m = new LinkedHashMap<>();
    for (Field f : proto.getFieldsList()) {
      m.put(f.getName().toStringUtf8(), f.getValue());
    }
    return Collections.unmodifiableMap(m);
  }

  /** {@link #fields()} as UTF-8 text. */
  public Map<String, String> textFields() {
    Map<String, String> m = new LinkedHashMap<>();
    for (Field f : proto.getFieldsList()) {
      m.put(f.getName().toStringUtf8(), f.getValue().toStringUtf8());
    }
    return Collections.unmodifiableMap(m);
  }

  /** The fields as received, in order, repeated names included. */
  public List<Field> rawFields() {
    return proto.getFieldsList();
  }

  /**
   * The typed command API: {@code d.redis().hincrby("totals", "apple", 2)} queues {@code HINCRBY
   * totals apple 2} as {@link #queue} does, the name and the argument types checked by the
   * compiler (see {@link RedisCommands}).
   */
  public RedisCommands redis() {
    return new RedisCommands(this);
  }

  /** Deliveries of this entry and of its earlier retried copies, this one included. */
  public int deliveryCount() {
    return proto.getDeliveryCount();
  }

  /**
   * The W3C trace context to continue when handling this delivery: the producer's (the entry's
   * {@code traceparent} / {@code tracestate} headers), else the sidecar's read span.
   */
  public TraceContext trace() {
    return proto.getTrace();
  }

  /** {@link #trace()}'s {@code traceparent} (empty when there is none). */
  public String traceparent() {
    return proto.getTrace().getTraceparent();
  }

  /** {@link #trace()}'s {@code tracestate} (empty when there is none). */
  public String tracestate() {
    return proto.getTrace().getTracestate();
  }

  /** Pub/sub: the channel the message arrived on (empty for other sources). */
  public String channel() {
    return proto.getChannel();
  }

  /**
   * On a partitioned stream ({@link SubscribeOptions.Builder#partitions}), the partition the entry
   * was read from (its stream is {@code <stream>:{partition}}). Entry ids repeat across
   * partitions, so the partition with {@link #entryId} names an entry where the entry id alone does
   * not. Empty on an unpartitioned stream, a list or pub/sub.
   */
  public OptionalInt partition() {
    return read.partition;
  }

  /**
   * The application's own trace context for handling this delivery (its span's {@code
   * traceparent}, and {@code tracestate} or null), sent with the outcome: the sidecar's flush span
   * links to it. Call it before the outcome.
   */
  public Delivery withHandlingTrace(String traceparent, String tracestate) {
    TraceContext.Builder t = TraceContext.newBuilder().setTraceparent(traceparent);
    if (tracestate != null) {
      t.setTracestate(tracestate);
    }
    synchronized (session.lock) {
      if (outcome != null) {
        throw new AlreadySettledException(this, outcome.getKind());
      }
      handlingTrace = t.build();
    }
    return this;
  }

  /** The delivery as received. */
  public dev.windowsidecar.v1.Delivery proto() {
    return proto;
  }

  /**
   * Queues a Redis command as a side effect: it runs only if the delivery is acked, in its read's
   * flush; its reply is never seen. Arguments: byte[], ByteString, CharSequence, numbers,
   * booleans (1/0), anything else by {@code toString()}. Ignored (returns this) when the stream
   * is gone.
   *
   * @throws AlreadySettledException when the delivery is already settled
   */
  public Delivery queue(String name, Object... args) {
    if (name == null || name.isEmpty()) {
      throw new IllegalArgumentException("a command needs a name");
    }
    QueuedCommand.Builder cmd = QueuedCommand.newBuilder().setSlot(slot()).setName(name);
    for (Object a : args) {
      cmd.addArgs(arg(a));
    }
    synchronized (session.lock) {
      if (outcome != null) {
        throw new AlreadySettledException(this, outcome.getKind());
      }
      if (session.usable()) {
        commands.add(cmd.build());
      }
    }
    return this;
  }

  /**
   * Still being worked on (NATS JetStream's {@code in_progress}): asks the sidecar, at once, to
   * keep other consumers from taking this delivery (a stream entry is made idle again for a
   * whole {@code min_idle}; a reliable list's lease is renewed). No outcome: settle it later as
   * usual. Returns false when the stream is gone.
   *
   * @throws AlreadySettledException when the delivery is already settled
   */
  public boolean extend() {
    return session.extend(this);
  }

  /**
   * {@link #extend()}.
   *
   * @deprecated the name every client uses is {@code extend}
   */
  @Deprecated
  public boolean inProgress() {
    return extend();
  }

  /**
   * Tells the subscription that the application settles this delivery later, from another
   * thread (a worker pool, an asynchronous call): the handler's normal return then does not ack
   * it. Without it, a delivery the handler returns without settling is acked.
   */
  public Delivery settleLater() {
    later = true;
    return this;
  }

  /** Keeps the queued commands: they run in the read's flush, with the entry's XACK. */
  public boolean ack() {
    return settle(OutcomeKind.OUTCOME_KIND_ACK, null, "");
  }

  /** Discards the queued commands; the entry is acked and never comes back. */
  public boolean drop(String reason) {
    return settle(OutcomeKind.OUTCOME_KIND_DROP, null, reason);
  }

  /** Discards the queued commands; a copy of the entry comes back at the end of the stream. */
  public boolean retry(String reason) {
    return settle(OutcomeKind.OUTCOME_KIND_RETRY, null, reason);
  }

  /** Discards the queued commands; the entry comes back after {@code delay} (at least 1 ms). */
  public boolean retryAfter(Duration delay) {
    return retryAfter(delay, "");
  }

  /** {@link #retryAfter(Duration)} with a reason, kept as the copy's header x-window-reason. */
  public boolean retryAfter(Duration delay, String reason) {
    if (delay == null || delay.compareTo(Duration.ofMillis(1)) < 0) {
      throw new IllegalArgumentException("retryAfter needs a delay of at least 1 ms, got " + delay);
    }
    return settle(OutcomeKind.OUTCOME_KIND_RETRY_AFTER, delay, reason);
  }

  /**
   * Discards the queued commands, as {@link #drop} does; the entry is written to the
   * subscription's dead-letter target at once, whatever its delivery count, with {@code reason}
   * (the dead letter's x-window-reason): for an entry no retry can fix.
   *
   * @throws IllegalStateException on a subscription without a dead-letter target ({@link
   *     SubscribeOptions.Builder#deadLetter}), and on pub/sub, which has none
   */
  public boolean deadLetter(String reason) {
    if (!session.hasDeadLetter()) {
      throw new IllegalStateException(
          "deadLetter needs a dead-letter target: subscribe with deadLetter(maxDeliveries, key),"
              + " or settle it with drop");
    }
    return settle(OutcomeKind.OUTCOME_KIND_DEAD_LETTER, null, reason);
  }

  /** The outcome given so far ({@code OUTCOME_KIND_UNSPECIFIED} while unsettled). */
  public OutcomeKind outcome() {
    synchronized (session.lock) {
      return outcome == null ? OutcomeKind.OUTCOME_KIND_UNSPECIFIED : outcome.getKind();
    }
  }

  /** Whether the delivery has an outcome. */
  public boolean isSettled() {
    synchronized (session.lock) {
      return outcome != null;
    }
  }

  private boolean settle(OutcomeKind kind, Duration delay, String reason) {
    Outcome.Builder o =
        Outcome.newBuilder().setSlot(slot()).setKind(kind).setReason(reason == null ? "" : reason);
    if (delay != null) {
      o.setDelay(
          com.google.protobuf.Duration.newBuilder()
              .setSeconds(delay.getSeconds())
              .setNanos(delay.getNano()));
    }
    synchronized (session.lock) {
      if (handlingTrace != null) {
        o.setTrace(handlingTrace);
      }
    }
    return session.settle(this, o.build());
  }

  @Override
  public String toString() {
    return "Delivery{slot=" + slot() + ", entry=" + entryId() + ", count=" + deliveryCount() + "}";
  }

  static ByteString arg(Object a) {
    if (a instanceof byte[] b) {
      return ByteString.copyFrom(b);
    }
    if (a instanceof ByteString b) {
      return b;
    }
    if (a instanceof Boolean b) {
      return ByteString.copyFromUtf8(b ? "1" : "0");
    }
    return ByteString.copyFrom(String.valueOf(a), StandardCharsets.UTF_8);
  }
}
