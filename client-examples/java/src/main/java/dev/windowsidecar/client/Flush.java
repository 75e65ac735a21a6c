package dev.windowsidecar.client;

import dev.windowsidecar.v1.FlushReport;
import java.util.List;

/**
 * The result of one read's flush. An ordered subscription's read may be flushed in parts, so one
 * read can have several.
 *
 * @param report the sidecar's report
 * @param settled the read's deliveries whose outcome reached the sidecar (since its previous
 *     report, when the read is flushed in parts), in outcome order. When
 *     {@code report.getOk()} is false and {@code report.getSettleFailed()} is true, their entries
 *     are still pending and come back.
 */
public record Flush(FlushReport report, List<Delivery> settled) {}
