package dev.windowsidecar.client;

/**
 * Handles one delivery: queue its side effects with {@link Delivery#queue}, and settle it with
 * {@link Delivery#ack}, {@link Delivery#drop}, {@link Delivery#retry} or {@link
 * Delivery#retryAfter}. A delivery the handler returns without settling is acked (a handler may
 * only queue commands), unless it called {@link Delivery#settleLater} to settle it later from
 * another thread; an unsettled delivery holds its read back: a read goes to the sidecar when
 * all its deliveries are settled.
 *
 * <p>When the handler throws and the delivery is still unsettled, it is settled with {@code
 * retry_after} ({@link SubscribeOptions.Builder#retryDelay}, 1 s doubling per delivery) and the reason {@code
 * handler failed: <the exception>}: never acked, never dropped.
 */
@FunctionalInterface
public interface DeliveryHandler {
  void handle(Delivery delivery) throws Exception;
}
