package dev.windowsidecar.client;

import dev.windowsidecar.v1.DeadLetter;
import dev.windowsidecar.v1.Framing;
import dev.windowsidecar.v1.Mode;
import dev.windowsidecar.v1.Open;
import dev.windowsidecar.v1.OrderingKey;
import dev.windowsidecar.v1.PubSubSource;
import dev.windowsidecar.v1.ReliableListSource;
import dev.windowsidecar.v1.SimpleListSource;
import dev.windowsidecar.v1.StreamSource;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.function.Consumer;

/**
 * What to subscribe to and how. One builder per source: {@link #builder(String, String)} (a
 * stream through a consumer group), {@link #reliableList}, {@link #simpleList}, {@link #pubsub}.
 * The builder's setters that a source does not take are ignored by the sidecar's rules, not here,
 * except {@link Builder#partitions}, which only a stream's open message has a place for.
 */
public final class SubscribeOptions {
  /** The Redis source a subscription reads. */
  enum Source {
    STREAM,
    RELIABLE_LIST,
    SIMPLE_LIST,
    PUBSUB
  }

  final Source source;
  /** The stream or list key; for pub/sub a description of the channels. */
  final String stream;
  final String group;
  final String consumer;
  final String startId;
  final int count;
  final int maxInFlight;
  final Duration block;
  final Duration minIdle;
  final Duration minBackoff;
  final Duration maxBackoff;
  final Duration openTimeout;
  final Duration closeTimeout;
  final Duration retryDelay;
  final Duration maxRetryDelay;
  final int maxAttempts;
  final RejectedOutcome rejectedOutcome;
  final Duration deadAfter;
  final List<String> channels;
  final List<String> patterns;
  final List<String> shardedChannels;
  final int pubsubBuffer;
  final Framing framing;
  final int maxDeliveries;
  final String deadLetter;
  final boolean atomic;
  final boolean packedAcks;
  final boolean reportsInReads;
  final String orderingHeader;
  final String orderingField;
  final int partitions;
  final Consumer<Flush> onFlush;
  final SubscriptionListener listener;

  private SubscribeOptions(Builder b) {
    source = b.source;
    stream = b.source == Source.PUBSUB ? "pubsub" + b.channels + b.patterns + b.shardedChannels : b.stream;
    group = b.group;
    consumer = b.consumer;
    startId = b.startId;
    count = b.count;
    maxInFlight = b.maxInFlight;
    block = b.block;
    minIdle = b.minIdle;
    minBackoff = b.minBackoff;
    maxBackoff = b.maxBackoff.compareTo(b.minBackoff) < 0 ? b.minBackoff : b.maxBackoff;
    openTimeout = b.openTimeout;
    closeTimeout = b.closeTimeout;
    retryDelay = b.retryDelay;
    maxRetryDelay = b.maxRetryDelay.compareTo(b.retryDelay) < 0 ? b.retryDelay : b.maxRetryDelay;
    maxAttempts = b.maxAttempts;
    rejectedOutcome = b.rejectedOutcome;
    deadAfter = b.deadAfter;
    channels = List.copyOf(b.channels);
    patterns = List.copyOf(b.patterns);
    shardedChannels = List.copyOf(b.shardedChannels);
    pubsubBuffer = b.pubsubBuffer;
    framing = b.framing;
    maxDeliveries = b.maxDeliveries;
    deadLetter = b.deadLetter;
    atomic = b.atomic;
    packedAcks = b.packedAcks;
    reportsInReads = b.reportsInReads;
    orderingHeader = b.orderingHeader;
    orderingField = b.orderingField;
    partitions = b.partitions;
    onFlush = b.onFlush;
    listener = b.listener == null ? new SubscriptionListener() {} : b.listener;
  }

  /** Options for the stream key {@code stream} read through the consumer group {@code group}. */
  public static Builder builder(String stream, String group) {
    if (group == null || group.isEmpty()) {
      throw new IllegalArgumentException("a stream subscription needs a group");
    }
    return new Builder(Source.STREAM, stream, group);
  }

  /**
   * A list read reliably (at least once): each read moves entries to this consumer's processing
   * list, which survives a restart. Takes {@link Builder#consumer} and {@link Builder#deadAfter}.
   */
  public static Builder reliableList(String key) {
    return new Builder(Source.RELIABLE_LIST, key, "");
  }

  /** A list read by popping: at most once, a crash loses what was in flight. */
  public static Builder simpleList(String key) {
    return new Builder(Source.SIMPLE_LIST, key, "");
  }

  /**
   * Pub/sub (at most once): messages published while the subscription is open, on the {@link
   * Builder#channels}, {@link Builder#patterns} and {@link Builder#shardedChannels} set.
   */
  public static Builder pubsub() {
    return new Builder(Source.PUBSUB, "", "");
  }

  /** "stream/group", the key of a list, or the channels; for log lines. */
  String describe() {
    if (source != Source.STREAM) {
      return stream;
    }
    // The key of a partitioned stream holds nothing itself: say where the entries are.
    String name = stream + "/" + group;
    return partitions > 0 ? name + " (" + partitions + " partitions)" : name;
  }

  /** The {@code open} message of a new stream. */
  Open toOpen() {
    Open.Builder open =
        Open.newBuilder()
            .setCount(count)
            .setMaxInFlight(maxInFlight)
            .setMode(atomic ? Mode.MODE_ATOMIC : Mode.MODE_PIPELINE)
            .setReportsInReads(reportsInReads);
    switch (source) {
      case STREAM -> {
        StreamSource.Builder s =
            StreamSource.newBuilder()
                .setKey(stream)
                .setGroup(group)
                .setConsumer(consumer)
                .setStartId(startId)
                .setPartitions(partitions);
        if (!minIdle.isZero()) {
          s.setMinIdle(duration(minIdle));
        }
        open.setStream(s);
      }
      case RELIABLE_LIST -> {
        ReliableListSource.Builder l = ReliableListSource.newBuilder().setKey(stream).setConsumer(consumer);
        if (!deadAfter.isZero()) {
          l.setDeadAfter(duration(deadAfter));
        }
        open.setReliableList(l);
      }
      case SIMPLE_LIST -> open.setSimpleList(SimpleListSource.newBuilder().setKey(stream));
      case PUBSUB ->
          open.setPubsub(
              PubSubSource.newBuilder()
                  .addAllChannels(channels)
                  .addAllPatterns(patterns)
                  .addAllShardedChannels(shardedChannels)
                  .setBuffer(pubsubBuffer));
    }
    if (framing != null) {
      open.setFraming(framing);
    }
    if (!block.isZero()) {
      open.setBlock(duration(block));
    }
    if (maxDeliveries > 0) {
      open.setMaxDeliveries(maxDeliveries);
      DeadLetter.Builder dl = DeadLetter.newBuilder();
      if (source == Source.STREAM) {
        dl.setStream(deadLetter);
      } else {
        dl.setList(deadLetter);
      }
      open.setDeadLetter(dl);
    }
    if (!orderingHeader.isEmpty()) {
      open.setOrderingKey(OrderingKey.newBuilder().setHeader(orderingHeader));
    } else if (!orderingField.isEmpty()) {
      open.setOrderingKey(OrderingKey.newBuilder().setField(orderingField));
    }
    return open.build();
  }

  /** Whether the subscription has an ordering key: its reads may be flushed in parts. */
  boolean ordered() {
    return !orderingHeader.isEmpty() || !orderingField.isEmpty();
  }

  /** Whether the subscription has a dead-letter target ({@link Delivery#deadLetter} needs one). */
  boolean hasDeadLetter() {
    return maxDeliveries > 0 && source != Source.PUBSUB;
  }

  /** The client's retry_after delay for the {@code count}-th delivery. */
  Duration retryDelay(int count) {
    Duration d = retryDelay;
    for (int i = 1; i < count && d.compareTo(maxRetryDelay) < 0; i++) {
      d = d.multipliedBy(2);
    }
    return d.compareTo(maxRetryDelay) > 0 ? maxRetryDelay : d;
  }

  static com.google.protobuf.Duration duration(Duration d) {
    return com.google.protobuf.Duration.newBuilder()
        .setSeconds(d.getSeconds())
        .setNanos(d.getNano())
        .build();
  }

  /** Builds {@link SubscribeOptions}. */
  public static final class Builder {
    private final Source source;
    private final String stream;
    private final String group;
    private String consumer = "";
    private String startId = "";
    private int count = 16;
    private int maxInFlight;
    private Duration block = Duration.ZERO;
    private Duration minIdle = Duration.ZERO;
    private Duration minBackoff = Duration.ofMillis(100);
    private Duration maxBackoff = Duration.ofSeconds(5);
    private Duration openTimeout = Duration.ofSeconds(10);
    private Duration closeTimeout = Duration.ofSeconds(10);
    private Duration retryDelay = Duration.ofSeconds(1);
    private Duration maxRetryDelay = Duration.ofMinutes(1);
    private int maxAttempts = 10;
    private RejectedOutcome rejectedOutcome = RejectedOutcome.AUTO;
    private Duration deadAfter = Duration.ZERO;
    private final List<String> channels = new ArrayList<>();
    private final List<String> patterns = new ArrayList<>();
    private final List<String> shardedChannels = new ArrayList<>();
    private int pubsubBuffer;
    private Framing framing;
    private int maxDeliveries;
    private String deadLetter = "";
    private boolean atomic;
    private boolean packedAcks;
    private boolean reportsInReads;
    private String orderingHeader = "";
    private String orderingField = "";
    private int partitions;
    private Consumer<Flush> onFlush;
    private SubscriptionListener listener;

    private Builder(Source source, String key, String group) {
      if (source != Source.PUBSUB && (key == null || key.isEmpty())) {
        throw new IllegalArgumentException("a subscription needs a key");
      }
      this.source = source;
      this.stream = key;
      this.group = group;
    }

    /** The consumer name: stable per replica (the pod name). Empty: the sidecar's own name. */
    public Builder consumer(String consumer) {
      this.consumer = Objects.requireNonNullElse(consumer, "");
      return this;
    }

    /** Where a newly created group starts: "0" (default) or "$". */
    public Builder startId(String startId) {
      this.startId = Objects.requireNonNullElse(startId, "");
      return this;
    }

    /** Entries per read (default 16). */
    public Builder count(int count) {
      if (count < 1) {
        throw new IllegalArgumentException("count must be at least 1");
      }
      this.count = count;
      return this;
    }

    /** The most deliveries handed out and not settled. 0 (default): twice the count. */
    public Builder maxInFlight(int maxInFlight) {
      this.maxInFlight = maxInFlight;
      return this;
    }

    /** How long one read waits for new entries. Zero: the sidecar's default (5 s). */
    public Builder block(Duration block) {
      this.block = block;
      return this;
    }

    /** Entries pending longer than this on any consumer are claimed. Zero: 60 s. */
    public Builder minIdle(Duration minIdle) {
      this.minIdle = minIdle;
      return this;
    }

    /** The wait between reconnection attempts: from min, doubling up to max (with jitter). */
    public Builder backoff(Duration min, Duration max) {
      this.minBackoff = min;
      this.maxBackoff = max;
      return this;
    }

    /** How long to wait for the sidecar's {@code opened} (default 10 s). */
    public Builder openTimeout(Duration openTimeout) {
      this.openTimeout = openTimeout;
      return this;
    }

    /** How long {@link Subscription#close} waits for the sidecar to flush (default 10 s). */
    public Builder closeTimeout(Duration closeTimeout) {
      this.closeTimeout = closeTimeout;
      return this;
    }

    /**
     * The first delay of a {@code retry_after} the client gives (a refused command, a handler that
     * threw): {@code retryDelay × 2^(deliveryCount − 1)}, at most {@link #maxRetryDelay} (default
     * 1 s).
     */
    public Builder retryDelay(Duration retryDelay) {
      if (retryDelay == null || retryDelay.toMillis() < 1) {
        throw new IllegalArgumentException("a retry delay is at least 1 ms");
      }
      this.retryDelay = retryDelay;
      return this;
    }

    /**
     * The retry_after delay for a delivery whose handler threw.
     *
     * @deprecated {@link #retryDelay}, which now doubles with the delivery count
     */
    @Deprecated
    public Builder errorRetryDelay(Duration errorRetryDelay) {
      return retryDelay(errorRetryDelay);
    }

    /** The cap of the client's retry delay (default 1 min). */
    public Builder maxRetryDelay(Duration maxRetryDelay) {
      this.maxRetryDelay = Objects.requireNonNull(maxRetryDelay, "maxRetryDelay");
      return this;
    }

    /**
     * How many consecutive opens may fail (the sidecar unreachable, a stream that ends before
     * {@code opened}) before the subscription gives up with a {@link SubscriptionEndedException}
     * (default 10; 0: never give up).
     */
    public Builder maxAttempts(int maxAttempts) {
      if (maxAttempts < 0) {
        throw new IllegalArgumentException("maxAttempts is 0 (never give up) or more");
      }
      this.maxAttempts = maxAttempts;
      return this;
    }

    /**
     * How a delivery is settled when the sidecar refuses one of its commands or its outcome
     * (default {@link RejectedOutcome#AUTO}); the listener's {@code error} gets a {@link
     * RejectedException} either way.
     */
    public Builder rejectedOutcome(RejectedOutcome rejectedOutcome) {
      this.rejectedOutcome = Objects.requireNonNull(rejectedOutcome, "rejectedOutcome");
      return this;
    }

    /** Called with every flush report, on a gRPC thread (keep it short). */
    public Builder onFlush(Consumer<Flush> onFlush) {
      this.onFlush = onFlush;
      return this;
    }

    /**
     * Caps the deliveries of an entry (streams and lists): an entry at the cap whose outcome is
     * retry or retry_after, or read again beyond it, goes to {@code deadLetter} instead (a
     * stream for a stream subscription, a list for a list one; on a cluster, in the hash slot of
     * the subscription's key). That is how a poison entry, retried forever otherwise (a handler
     * that throws, a command the sidecar refuses), ends.
     */
    public Builder deadLetter(int maxDeliveries, String deadLetter) {
      if (maxDeliveries < 1 || deadLetter == null || deadLetter.isEmpty()) {
        throw new IllegalArgumentException("a dead letter needs a cap of at least 1 and a key");
      }
      this.maxDeliveries = maxDeliveries;
      this.deadLetter = deadLetter;
      return this;
    }

    /**
     * Atomic mode: each acked delivery's commands and its own settle run as one script,
     * instead of one pipeline for the whole read (the default, faster). For side effects that
     * must never be seen half-applied.
     */
    public Builder atomic(boolean atomic) {
      this.atomic = atomic;
      return this;
    }

    /**
     * Packed acks: a plain ack (no reason, no trace context) goes in the batch's {@code acks}
     * (its slot only) rather than as an {@code Outcome}: smaller batches, the same effect.
     */
    public Builder packedAcks(boolean packedAcks) {
      this.packedAcks = packedAcks;
      return this;
    }

    /**
     * Flush reports in reads: when a flush carried the subscription's next read, the sidecar
     * sends its report inside that read ({@code Read.flushed}) instead of a message of its own;
     * the client hands it to {@link #onFlush} before the read's deliveries.
     */
    public Builder reportsInReads(boolean reportsInReads) {
      this.reportsInReads = reportsInReads;
      return this;
    }

    /**
     * Streams and reliable lists: the entry's ordering key is this header (a stream entry's
     * {@code h:<name>} field, a list value's frame header). Entries that share a key are
     * delivered one at a time, in the order read: the next waits in the sidecar until the one
     * before is settled and flushed; other keys flow meanwhile; {@code retry} and {@code
     * retryAfter} keep the entry in its place. Each outcome is then sent as soon as it is given,
     * not with the rest of its read, and a read may be flushed in parts (several {@link
     * #onFlush} calls with its id). At most one of this and {@link #orderingField}.
     */
    public Builder orderingHeader(String header) {
      this.orderingHeader = Objects.requireNonNull(header, "header");
      return this;
    }

    /**
     * Streams: the entry's ordering key is this field as stored, for entries another producer
     * wrote without the headers layout. See {@link #orderingHeader}.
     */
    public Builder orderingField(String field) {
      this.orderingField = Objects.requireNonNull(field, "field");
      return this;
    }

    /**
     * Streams: reads the partitioned stream named by the key, whose partitions are the streams
     * {@code key:{0}} … {@code key:{partitions-1}} (where {@link
     * PublishTarget#withPartitionsByHeader} publishes). The group's subscriptions that open it
     * with the same number share the partitions out among themselves, each partition read by one
     * of them at a time and handed over as replicas come and go; {@link #consumer} names this
     * replica among them, so give each replica its own. With {@link #orderingHeader} or {@link
     * #orderingField}, a key's entries (all in one partition when the producer put them there by
     * that key) are handed out one at a time across the whole group, not only within this
     * subscription. Every partition this replica reads comes through this one subscription.
     *
     * <p>A partition handed over waits for the outcomes of its deliveries out, as a draining
     * sidecar does; an outcome that comes later still (past the sidecar's {@code
     * --shutdown-grace}, or from a replica stalled past {@code --consumer-lease}) is refused as
     * {@code ALREADY_SETTLED}, a {@link RejectedException} to the listener, and the entry is
     * delivered again by the partition's new reader. No flush report ever names such a delivery:
     * the subscription counts it done for its read, and drops the read once the rest of it is
     * done too.
     *
     * <p>At most 1024 (the sidecar refuses more); 0 (default): the stream {@code key} itself.
     */
    public Builder partitions(int partitions) {
      if (source != Source.STREAM) {
        String reads = source == Source.PUBSUB ? "pub/sub" : "a list";
        throw new IllegalArgumentException(
            "partitions are for a stream read through a consumer group"
                + " (SubscribeOptions.builder(stream, group)); this subscription reads "
                + reads);
      }
      if (partitions < 0) {
        throw new IllegalArgumentException(
            "partitions is how many the stream has (at least 1), or 0 for the stream itself; got "
                + partitions);
      }
      this.partitions = partitions;
      return this;
    }

    /** Sees the subscription's lifecycle (opened, resubscribed, draining, disconnected) and errors. */
    public Builder listener(SubscriptionListener listener) {
      this.listener = listener;
      return this;
    }

    /** Reliable lists: a consumer silent for this long is dead and its entries go back. Zero: 30 s. */
    public Builder deadAfter(Duration deadAfter) {
      this.deadAfter = deadAfter;
      return this;
    }

    /** Pub/sub: channels to SUBSCRIBE to. */
    public Builder channels(String... channels) {
      this.channels.addAll(List.of(channels));
      return this;
    }

    /** Pub/sub: patterns to PSUBSCRIBE to. */
    public Builder patterns(String... patterns) {
      this.patterns.addAll(List.of(patterns));
      return this;
    }

    /** Pub/sub: sharded channels to SSUBSCRIBE to (Redis 7). */
    public Builder shardedChannels(String... shardedChannels) {
      this.shardedChannels.addAll(List.of(shardedChannels));
      return this;
    }

    /**
     * Pub/sub: the most messages the sidecar buffers for a slow client; when full the oldest are
     * dropped. 0 (default): 10000.
     */
    public Builder pubsubBuffer(int pubsubBuffer) {
      if (pubsubBuffer < 0) {
        throw new IllegalArgumentException("a buffer is a size");
      }
      this.pubsubBuffer = pubsubBuffer;
      return this;
    }

    /**
     * Lists and pub/sub: how a value carries headers. {@code FRAMING_FRAMES} (the default): a
     * value that parses as a frame is its payload and headers, anything else the payload as it
     * is. {@code FRAMING_RAW}: values are opaque payloads, retried and dead-lettered as stored.
     */
    public Builder framing(Framing framing) {
      this.framing = framing;
      return this;
    }

    public SubscribeOptions build() {
      if (source == Source.PUBSUB && channels.isEmpty() && patterns.isEmpty() && shardedChannels.isEmpty()) {
        throw new IllegalArgumentException("a pub/sub subscription needs a channel or a pattern");
      }
      if (!orderingHeader.isEmpty() && !orderingField.isEmpty()) {
        throw new IllegalArgumentException("orderingHeader and orderingField: one ordering key, not both");
      }
      return new SubscribeOptions(this);
    }
  }
}
