// Tests against a real window-sidecar and redis-server, each started here on a free port (as
// ../e2e-lib.sh starts them): what a fake sidecar cannot show, such as a group's replicas
// sharing a partitioned stream.
//
//   WINDOW_SIDECAR_BIN=/path/to/window-sidecar npm run test:sidecar
//
// The sidecar is WINDOW_SIDECAR_BIN, by default the repository's target/debug/window-sidecar;
// redis-server comes from PATH. run-e2e.sh runs these with the sidecar it built or was given.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createClient } from "@redis/client";
import { WindowClient, type Delivery, type Logger } from "../src/window-client";

const quiet: Logger = { debug() {}, info() {}, warn() {}, error() {} };
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

const sidecarBin = resolve(process.env.WINDOW_SIDECAR_BIN ?? join(__dirname, "..", "..", "..", "..", "target", "debug", "window-sidecar"));

function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const srv = createServer().listen(0, "127.0.0.1", () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect(port, "127.0.0.1");
    sock.once("connect", () => {
      sock.destroy();
      resolve(true);
    });
    sock.once("error", () => resolve(false));
  });
}

/** Polls `ready` every 100 ms until it holds, for `ms` at the most. */
async function waitFor(what: string, ready: () => boolean | Promise<boolean>, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await ready())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

/** A throwaway redis-server and a sidecar against it; `stop()` ends both and, after a pass, removes their files. */
async function startSidecar(...args: string[]) {
  assert.ok(existsSync(sidecarBin), `the sidecar binary ${sidecarBin} is missing: build it (cargo build -p window-sidecar) or set WINDOW_SIDECAR_BIN`);
  const dir = mkdtempSync(join(tmpdir(), "window-client-sidecar-"));
  const procs: ChildProcess[] = [];
  const start = async (cmd: string, argv: string[], log: string) => {
    const p = spawn(cmd, argv, { stdio: ["ignore", openSync(join(dir, log), "w"), openSync(join(dir, log), "a")] });
    procs.push(p);
    await once(p, "spawn"); // rejects when there is no such program
  };
  const clients: { client?: WindowClient; redis?: ReturnType<typeof createClient> } = {};
  const stop = async (passed: boolean) => {
    clients.client?.close();
    if (clients.redis?.isOpen) await clients.redis.close();
    for (const p of procs) {
      if (p.pid === undefined || p.exitCode !== null || p.signalCode !== null) continue;
      const exited = once(p, "exit");
      p.kill("SIGTERM");
      await exited;
    }
    if (passed) {
      rmSync(dir, { recursive: true, force: true });
      return;
    }
    const log = join(dir, "sidecar.log");
    const tail = existsSync(log) ? readFileSync(log, "utf8").split("\n").slice(-30).join("\n") : "";
    console.error(`--- sidecar.log (last lines; logs kept in ${dir})\n${tail}`);
  };
  try {
    const redisPort = await freePort();
    await start("redis-server", ["--port", String(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir], "redis.log");
    await waitFor(`redis-server on ${redisPort}`, () => listening(redisPort));
    const redis = (clients.redis = createClient({ url: `redis://127.0.0.1:${redisPort}` }));
    await redis.connect();
    const addr = `127.0.0.1:${await freePort()}`;
    await start(sidecarBin, ["--listen", addr, "--redis-url", `redis://127.0.0.1:${redisPort}`, "--promote-interval", "100ms", "--shutdown-grace", "5s", ...args], "sidecar.log");
    const client = (clients.client = new WindowClient(addr, { tls: false }));
    await waitFor(`the sidecar on ${addr}`, () => client.health().then((s) => s === "SERVING", () => false));
    return { addr, client, redis, stop };
  } catch (e) {
    await stop(false);
    throw e;
  }
}

/** The partition `publish` routes a key to: the 32-bit FNV-1a hash of its bytes modulo `partitions`. */
function partitionOf(key: string, partitions: number): number {
  let hash = 0x811c9dc5;
  for (const byte of Buffer.from(key, "utf8")) hash = Math.imul(hash ^ byte, 0x01000193) >>> 0;
  return hash % partitions;
}

test("a partitioned stream: two replicas of a group share the partitions, each key's entries once each and in order", { timeout: 120_000 }, async (t) => {
  const sidecar = await startSidecar("--consumer-lease", "2s");
  let passed = false;
  try {
    const { client, redis } = sidecar;
    const [stream, group, partitions, keys] = ["parts", "g", 4, 20];
    const effects = "effects";
    // What both subscriptions saw, in the order they saw it (one thread: one order).
    const deliveries = new Map<string, number>();
    const handled = new Map<string, string[]>();
    const acked = new Map<string, number>();
    const perReplica = new Map<string, number>();
    const out = new Map<string, string>();
    const overlaps: string[] = [];
    const rejections: string[] = [];

    const replica = (consumer: string) => {
      let opened!: () => void;
      const open = new Promise<void>((r) => (opened = r));
      const sub = client.subscribe({
        stream, group, consumer, partitions, orderingHeader: "k", count: 8, logger: quiet,
        onOpened: () => opened(),
        onRejection: (rej) => {
          rejections.push(`${consumer}: slot ${rej.slot}: ${rej.message}`);
        },
        onFlush: (ev) => {
          if (!ev.ok) return;
          for (const d of ev.settled) if (d.outcome === "ack") acked.set(d.text(), (acked.get(d.text()) ?? 0) + 1);
        },
      });
      // Several handlers at a time: a key's order is the sidecar's doing, not one-at-a-time handling.
      const running = sub.run(async (d: Delivery) => {
        const key = d.headers.k;
        const name = d.text();
        const earlier = out.get(key);
        if (earlier !== undefined) overlaps.push(`${name} reached ${consumer} while ${earlier} was out`);
        out.set(key, `${name} at ${consumer}`);
        deliveries.set(name, (deliveries.get(name) ?? 0) + 1);
        handled.set(key, [...(handled.get(key) ?? []), name]);
        perReplica.set(consumer, (perReplica.get(consumer) ?? 0) + 1);
        await sleep(Math.random() * 5);
        d.redis.hIncrBy(effects, name, 1);
        // The key is free for the group the moment this outcome leaves.
        out.delete(key);
        d.ack();
      }, { concurrency: 8 });
      return { sub, open, running };
    };
    const replicas = [replica("w1"), replica("w2")];
    await Promise.all(replicas.map((r) => r.open));

    // Rounds of a few entries per key, interleaved, while the replicas balance (membership is
    // renewed every third of the 2 s lease), until both have had deliveries: a partition may
    // change hands mid-run, and a read may hold several entries of one key.
    const published: string[] = [];
    const perRound = 3;
    let rounds = 0;
    while (rounds < 5 || (perReplica.size < 2 && rounds < 60)) {
      const entries = Array.from({ length: keys * perRound }, (_, j) => {
        const [i, n] = [j % keys, rounds * perRound + Math.floor(j / keys)];
        return { payload: `key${i}:${n}`, headers: { k: `key${i}` } };
      });
      await client.publish(stream, entries, { partitions, partitionHeader: "k" });
      published.push(...entries.map((e) => e.payload));
      rounds += 1;
      await sleep(300);
    }
    // Past the wait, the assertions below say what is missing.
    await waitFor("every entry acked", () => published.every((name) => acked.has(name)), 60_000).catch(() => undefined);
    for (const r of replicas) r.sub.stop();
    await Promise.all(replicas.map(async (r) => {
      await r.running;
      await r.sub.close();
    }));

    t.diagnostic(`${rounds} rounds of ${perRound} entries of each of ${keys} keys; deliveries per replica: ${JSON.stringify(Object.fromEntries(perReplica))}`);
    assert.deepEqual(overlaps, []);
    const once = (counts: Map<string, number>) => published.filter((name) => counts.get(name) !== 1);
    assert.deepEqual(once(deliveries), [], "delivered other than once");
    assert.deepEqual(once(acked), [], "acked other than once");
    assert.equal(deliveries.size, published.length);
    for (let i = 0; i < keys; i++) {
      assert.deepEqual(handled.get(`key${i}`), Array.from({ length: rounds * perRound }, (_, n) => `key${i}:${n}`), `key${i} out of order`);
    }
    assert.ok((perReplica.get("w1") ?? 0) > 0 && (perReplica.get("w2") ?? 0) > 0, `deliveries per replica: ${JSON.stringify([...perReplica])}`);
    assert.deepEqual(rejections, []);

    // Redis: each side effect once, each key in its own partition, nothing left pending.
    const effectsHash = await redis.hGetAll(effects);
    assert.deepEqual(Object.keys(effectsHash).sort(), [...published].sort());
    assert.ok(Object.values(effectsHash).every((v) => v === "1"), "a side effect ran more than once");
    assert.equal(await redis.exists(stream), 0);
    let total = 0;
    for (let p = 0; p < partitions; p++) {
      const key = `${stream}:{${p}}`;
      const entries = (await redis.xRange(key, "-", "+")) ?? [];
      total += entries.length;
      for (const e of entries) assert.equal(partitionOf(e.message["h:k"], partitions), p, `${e.message._payload} in ${key}`);
      assert.equal((await redis.xPending(key, group)).pending, 0, `pending on ${key}`);
    }
    assert.equal(total, published.length);
    passed = true;
  } finally {
    await sidecar.stop(passed);
  }
});
