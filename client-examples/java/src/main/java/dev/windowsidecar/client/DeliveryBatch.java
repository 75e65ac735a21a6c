package dev.windowsidecar.client;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.OptionalInt;
import java.util.function.Predicate;

/**
 * One read's deliveries in stream order, handed out together to a {@link BatchHandler}: settle a
 * delivery on its own where the handler must ({@code d.drop(reason)}, {@code d.queue(…)} then
 * {@code d.ack()}), and the rest with one call. Named apart from the protocol's {@code Batch}
 * message, which carries outcomes the other way.
 */
public final class DeliveryBatch implements Iterable<Delivery> {
  private final long readId;
  private final OptionalInt partition;
  private final List<Delivery> deliveries;

  DeliveryBatch(long readId, OptionalInt partition, List<Delivery> deliveries) {
    this.readId = readId;
    this.partition = partition;
    this.deliveries = List.copyOf(deliveries);
  }

  /** The read these deliveries came in. */
  public long readId() {
    return readId;
  }

  /**
   * On a partitioned stream, the partition the read came from, that of each of its deliveries
   * ({@link Delivery#partition}: entry ids repeat across partitions); empty on an unpartitioned
   * stream.
   */
  public OptionalInt partition() {
    return partition;
  }

  /** The deliveries, in stream order. */
  public List<Delivery> deliveries() {
    return deliveries;
  }

  public int size() {
    return deliveries.size();
  }

  @Override
  public Iterator<Delivery> iterator() {
    return deliveries.iterator();
  }

  /** The deliveries without an outcome yet. */
  public List<Delivery> unsettled() {
    List<Delivery> out = new ArrayList<>();
    for (Delivery d : deliveries) {
      if (!d.isSettled()) {
        out.add(d);
      }
    }
    return out;
  }

  /**
   * Acks every delivery without an outcome yet, with the commands queued on it. False when
   * their stream is gone (they come back), as {@link Delivery#ack} says.
   */
  public boolean ack() {
    return each(Delivery::ack);
  }

  /** Drops every delivery without an outcome yet. */
  public boolean drop(String reason) {
    return each(d -> d.drop(reason));
  }

  /** Retries every delivery without an outcome yet. */
  public boolean retry(String reason) {
    return each(d -> d.retry(reason));
  }

  private boolean each(Predicate<Delivery> settle) {
    boolean sent = true;
    for (Delivery d : unsettled()) {
      try {
        sent &= settle.test(d);
      } catch (AlreadySettledException raced) {
        // settled meanwhile from another thread
      }
    }
    return sent;
  }
}
