package dev.windowsidecar.client;

import dev.windowsidecar.v1.Rejection;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.function.BiConsumer;
import java.util.function.Consumer;

/** What to subscribe to and how. Build with {@link #builder(String, String)}. */
public final class SubscribeOptions {
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
  final Duration errorRetryDelay;
  final Consumer<Flush> onFlush;
  final BiConsumer<Delivery, List<Rejection>> onRejection;

  private SubscribeOptions(Builder b) {
    stream = b.stream;
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
    errorRetryDelay = b.errorRetryDelay;
    onFlush = b.onFlush;
    onRejection = b.onRejection;
  }

  /** Options for the stream key {@code stream} read through the consumer group {@code group}. */
  public static Builder builder(String stream, String group) {
    return new Builder(stream, group);
  }

  /** Builds {@link SubscribeOptions}. */
  public static final class Builder {
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
    private Duration errorRetryDelay = Duration.ofSeconds(1);
    private Consumer<Flush> onFlush;
    private BiConsumer<Delivery, List<Rejection>> onRejection;

    private Builder(String stream, String group) {
      if (stream == null || stream.isEmpty() || group == null || group.isEmpty()) {
        throw new IllegalArgumentException("a subscription needs a stream and a group");
      }
      this.stream = stream;
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

    /** The retry_after delay for a delivery whose handler threw (default 1 s). */
    public Builder errorRetryDelay(Duration errorRetryDelay) {
      this.errorRetryDelay = errorRetryDelay;
      return this;
    }

    /** Called with every flush report, on a gRPC thread (keep it short). */
    public Builder onFlush(Consumer<Flush> onFlush) {
      this.onFlush = onFlush;
      return this;
    }

    /**
     * Called when the sidecar refuses a delivery's outcome (for example INCOMPLETE_SEGMENT: one
     * of its commands was refused). The delivery is open again: settle it with drop, retry or
     * retryAfter. Unset: such a delivery is dropped with the rejection as its reason (a refused
     * command would be refused again on every retry).
     */
    public Builder onRejection(BiConsumer<Delivery, List<Rejection>> onRejection) {
      this.onRejection = onRejection;
      return this;
    }

    public SubscribeOptions build() {
      return new SubscribeOptions(this);
    }
  }
}
