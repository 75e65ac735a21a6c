package dev.windowsidecar.client;

import dev.windowsidecar.v1.OrderingKey;
import java.util.Objects;

/**
 * Where {@link WindowClient#publish(PublishTarget, java.util.List)} puts its entries: a stream
 * (XADD), a partitioned stream (XADD to each entry's partition, {@link #withPartitionsByHeader}),
 * a list (LPUSH, where list subscriptions read), a channel (PUBLISH) or a sharded channel
 * (SPUBLISH, Redis 7).
 *
 * @param kind which of the four
 * @param name the stream or list key, or the channel
 * @param maxLen streams: trims the stream (each partition of a partitioned one) to about this
 *     many entries (XADD MAXLEN ~); 0: no trim
 * @param raw lists and channels: the payload is written alone, as it is ({@code FRAMING_RAW}:
 *     headers are refused); false: a frame when the entry has headers or a trace context
 * @param partitions streams: how many partitions the stream {@code name} has, the streams {@code
 *     name:{0}} … {@code name:{partitions-1}}; 0: not partitioned, the stream {@code name} itself
 * @param partitionHeader with {@code partitions}: the header that holds each entry's ordering
 *     key; empty otherwise
 * @param partitionField with {@code partitions}: the field, as stored, that holds it instead;
 *     empty otherwise
 */
public record PublishTarget(
    Kind kind,
    String name,
    long maxLen,
    boolean raw,
    int partitions,
    String partitionHeader,
    String partitionField) {
  /** The four kinds of target. */
  public enum Kind {
    STREAM,
    LIST,
    CHANNEL,
    SHARDED_CHANNEL
  }

  public PublishTarget {
    Objects.requireNonNull(kind, "kind");
    if (name == null || name.isEmpty()) {
      throw new IllegalArgumentException("a publish target needs a key or a channel");
    }
    if (maxLen < 0 || (maxLen > 0 && kind != Kind.STREAM)) {
      throw new IllegalArgumentException("maxLen is a positive length, for a stream only");
    }
    if (raw && kind == Kind.STREAM) {
      throw new IllegalArgumentException("raw values are for lists and channels");
    }
    partitionHeader = Objects.requireNonNullElse(partitionHeader, "");
    partitionField = Objects.requireNonNullElse(partitionField, "");
    boolean keyed = !partitionHeader.isEmpty() || !partitionField.isEmpty();
    if (partitions < 0) {
      throw new IllegalArgumentException(
          "partitions is how many the stream has (at least 1), or 0 for the stream itself; got "
              + partitions);
    }
    if ((partitions > 0 || keyed) && kind != Kind.STREAM) {
      throw new IllegalArgumentException(
          "partitions are for a stream (PublishTarget.stream(key)); "
              + name
              + " is a "
              + kind.name().toLowerCase(java.util.Locale.ROOT).replace('_', ' '));
    }
    if (partitions == 0 && keyed) {
      throw new IllegalArgumentException(
          "a partition key needs partitions: how many partitions the stream has, the number its"
              + " subscriptions open it with (withPartitionsByHeader(partitions, header))");
    }
    if (!partitionHeader.isEmpty() && !partitionField.isEmpty()) {
      throw new IllegalArgumentException(
          "partitionHeader and partitionField: one partition key, not both");
    }
    if (partitions > 0 && !keyed) {
      throw new IllegalArgumentException(
          "partitions needs the entries' partition key, which picks each entry's partition:"
              + " withPartitionsByHeader(partitions, header) or withPartitionsByField(partitions,"
              + " field)");
    }
  }

  /** A target that is not a partitioned stream. */
  public PublishTarget(Kind kind, String name, long maxLen, boolean raw) {
    this(kind, name, maxLen, raw, 0, "", "");
  }

  /** A stream key: entries are appended with XADD, payload as {@code _payload}, headers as {@code h:<name>}. */
  public static PublishTarget stream(String key) {
    return new PublishTarget(Kind.STREAM, key, 0, false);
  }

  /** A list key: each entry's value is pushed with LPUSH (a frame when it has headers). */
  public static PublishTarget list(String key) {
    return new PublishTarget(Kind.LIST, key, 0, false);
  }

  /** A channel: each entry's value is published with PUBLISH (a frame when it has headers). */
  public static PublishTarget channel(String channel) {
    return new PublishTarget(Kind.CHANNEL, channel, 0, false);
  }

  /** A sharded channel: each entry's value is published with SPUBLISH. */
  public static PublishTarget shardedChannel(String channel) {
    return new PublishTarget(Kind.SHARDED_CHANNEL, channel, 0, false);
  }

  /** This stream target, trimmed to about {@code maxLen} entries by every publish. */
  public PublishTarget withMaxLen(long maxLen) {
    return new PublishTarget(kind, name, maxLen, raw, partitions, partitionHeader, partitionField);
  }

  /** This list or channel target, writing each payload alone and as it is (no frame). */
  public PublishTarget withRawValues() {
    return new PublishTarget(kind, name, maxLen, true, partitions, partitionHeader, partitionField);
  }

  /**
   * This stream target as a partitioned stream of {@code partitions} (at least 1, at most 1024)
   * streams, {@code name:{0}} … {@code name:{partitions-1}}: each entry goes to the partition of
   * its key, the value of its header {@code header} (matched in any case), partition {@code n}
   * being the 32-bit FNV-1a hash of the key's bytes modulo {@code partitions}. A key's entries
   * so stay in one partition, in the order published; entries without the header take the
   * partitions in turn. Give the number the subscriptions open the stream with ({@link
   * SubscribeOptions.Builder#partitions}) and the header they order by ({@link
   * SubscribeOptions.Builder#orderingHeader}): with another number, a key's entries land where
   * its readers do not look for them. The ids answered are in the entries' order, each one of
   * its own partition's stream.
   */
  public PublishTarget withPartitionsByHeader(int partitions, String header) {
    Objects.requireNonNull(header, "header");
    return new PublishTarget(kind, name, maxLen, raw, partitions, header, "");
  }

  /**
   * {@link #withPartitionsByHeader}, the key being the field {@code field} as stored. This
   * client writes a message's headers as the fields {@code h:<name>}, so the header is the usual
   * way; a field is for a key the subscriptions read with {@link
   * SubscribeOptions.Builder#orderingField}.
   */
  public PublishTarget withPartitionsByField(int partitions, String field) {
    Objects.requireNonNull(field, "field");
    return new PublishTarget(kind, name, maxLen, raw, partitions, "", field);
  }

  /** The request's {@code partition_by}; null when the target is not partitioned. */
  OrderingKey partitionBy() {
    if (partitions == 0) {
      return null;
    }
    return partitionHeader.isEmpty()
        ? OrderingKey.newBuilder().setField(partitionField).build()
        : OrderingKey.newBuilder().setHeader(partitionHeader).build();
  }
}
