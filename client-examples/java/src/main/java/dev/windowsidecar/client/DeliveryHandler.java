package dev.windowsidecar.client;

/**
 * Handles one delivery: queue its side effects with {@link Delivery#queue}, then settle it with
 * {@link Delivery#ack}, {@link Delivery#drop}, {@link Delivery#retry} or {@link
 * Delivery#retryAfter} — here or later, from any thread. A delivery left unsettled holds its
 * read back: a read goes to the sidecar when all its deliveries are settled.
 *
 * <p>When the handler throws and the delivery is still unsettled, it is settled with {@code
 * retry_after} ({@link SubscribeOptions.Builder#errorRetryDelay}), the exception as its reason.
 */
@FunctionalInterface
public interface DeliveryHandler {
  void handle(Delivery delivery) throws Exception;
}
