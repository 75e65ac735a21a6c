package dev.windowsidecar.client;

import dev.windowsidecar.v1.FlushReport;
import java.util.List;

/**
 * The result of one read's flush.
 *
 * @param report the sidecar's report
 * @param settled the read's deliveries whose outcome reached the sidecar, in outcome order. When
 *     {@code report.getOk()} is false and {@code report.getSettleFailed()} is true, their entries
 *     are still pending and come back.
 */
public record Flush(FlushReport report, List<Delivery> settled) {}
