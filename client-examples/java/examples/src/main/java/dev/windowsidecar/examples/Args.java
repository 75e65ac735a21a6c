package dev.windowsidecar.examples;

import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

/** {@code --name value} / {@code --name=value} flags, enough for the examples. */
final class Args {
  private final Map<String, String> values = new HashMap<>();

  Args(String[] argv) {
    for (int i = 0; i < argv.length; i++) {
      String a = argv[i];
      if (!a.startsWith("--")) {
        throw usage("unexpected argument " + a);
      }
      String name = a.substring(2);
      int eq = name.indexOf('=');
      if (eq >= 0) {
        values.put(name.substring(0, eq), name.substring(eq + 1));
      } else if (i + 1 < argv.length) {
        values.put(name, argv[++i]);
      } else {
        throw usage("flag --" + name + " needs a value");
      }
    }
  }

  String get(String name, String def) {
    String v = values.remove(name);
    return v == null ? def : v;
  }

  int getInt(String name, int def) {
    String v = values.remove(name);
    return v == null ? def : Integer.parseInt(v);
  }

  /** A duration such as 200ms, 30s, 2m. */
  Duration getDuration(String name, Duration def) {
    String v = values.remove(name);
    if (v == null) {
      return def;
    }
    if (v.endsWith("ms")) {
      return Duration.ofMillis(Long.parseLong(v.substring(0, v.length() - 2)));
    }
    if (v.endsWith("s")) {
      return Duration.ofMillis((long) (Double.parseDouble(v.substring(0, v.length() - 1)) * 1000));
    }
    if (v.endsWith("m")) {
      return Duration.ofSeconds(Long.parseLong(v.substring(0, v.length() - 1)) * 60);
    }
    throw usage("--" + name + ": not a duration (200ms, 30s, 2m): " + v);
  }

  /** Fails on flags nobody asked for. */
  void done() {
    if (!values.isEmpty()) {
      throw usage("unknown flags: " + values.keySet());
    }
  }

  static String env(String name, String def) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? def : v;
  }

  private static IllegalArgumentException usage(String message) {
    return new IllegalArgumentException(message);
  }
}
