// A tiny `--name value` (and `--switch`) argument parser, so the examples need no dependency for it.
export function parseArgs(argv: string[], known: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = { ...known };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "-h" || a === "--help") {
      console.log(`options: ${Object.keys(known).map((k) => `--${k} (${known[k] || "unset"})`).join(" ")}`);
      process.exit(0);
    }
    const m = /^--([a-z-]+)(?:=(.*))?$/.exec(a);
    if (!m || !(m[1] in known)) {
      console.error(`unknown argument ${a}`);
      process.exit(64);
    }
    // A bare flag (last, or followed by another flag) is a switch: "true".
    const next = argv[i + 1];
    out[m[1]] = m[2] ?? (next === undefined || next.startsWith("--") ? "true" : argv[++i]);
  }
  return out;
}
