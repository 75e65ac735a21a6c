package dev.windowsidecar.examples;

import com.google.gson.Gson;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/** The example's domain: the order set of ../orders.json and its rules. */
final class Orders {
  private static final Gson GSON = new Gson();

  private Orders() {}

  /** One order line. */
  static final class Line {
    String sku;
    long qty;
  }

  /** One order, as published in an entry's payload. */
  static final class Order {
    String id;
    List<Line> lines;
    boolean flaky; // fails on its first delivery
    boolean poison; // its handling queues a command the sidecar refuses (FLUSHALL)

    /** Why the order can never be processed, or null when it is valid. */
    String invalid() {
      if (id == null || id.isEmpty()) {
        return "order without an id";
      }
      if (lines == null || lines.isEmpty()) {
        return "order has no lines";
      }
      for (int i = 0; i < lines.size(); i++) {
        Line l = lines.get(i);
        if (l == null || l.sku == null || l.sku.isEmpty()) {
          return "line " + (i + 1) + " has no sku";
        }
        if (l.qty <= 0) {
          return "line " + (i + 1) + " (" + l.sku + ") has qty " + l.qty + " <= 0";
        }
      }
      return null;
    }
  }

  /** orders.json: the stream key and the orders, each as compact JSON. */
  record File(String stream, String group, List<String> payloads) {}

  static File load(Path path) throws IOException {
    JsonObject root = JsonParser.parseString(Files.readString(path)).getAsJsonObject();
    List<String> payloads = new ArrayList<>();
    for (JsonElement order : root.getAsJsonArray("orders")) {
      payloads.add(order.toString()); // compact JSON
    }
    return new File(root.get("stream").getAsString(), root.get("group").getAsString(), payloads);
  }

  /** Decodes a payload; throws on malformed JSON. */
  static Order parse(String payload) {
    Order o = GSON.fromJson(payload, Order.class);
    if (o == null) {
      throw new IllegalArgumentException("empty payload");
    }
    return o;
  }
}
