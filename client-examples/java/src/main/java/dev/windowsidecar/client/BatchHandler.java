package dev.windowsidecar.client;

/**
 * Handles one read at a time ({@link WindowClient#subscribeBatches}). The rule of every
 * window-sidecar client applies to each delivery of the batch: one the handler leaves without an
 * outcome (and not {@link Delivery#settleLater}) is acked when it returns; when it throws, every
 * delivery still without an outcome is settled with retry_after (the growing delay of {@link
 * SubscribeOptions}) and the reason "handler failed: …", never acked, never dropped.
 */
@FunctionalInterface
public interface BatchHandler {
  void handle(DeliveryBatch batch) throws Exception;
}
