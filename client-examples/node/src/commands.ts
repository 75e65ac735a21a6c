// Typed side effects: node-redis's own command builders (@redis/client), recorded instead of
// sent.
//
// `delivery.redis` offers every command of node-redis's client, in its two spellings
// (`hIncrBy` and `HINCRBY`), with node-redis's own argument types: each builds its arguments
// with the command's `parseCommand` (the code node-redis runs before sending) and queues them on
// the delivery, so the command runs only with the delivery's ack. A misspelled name is a type
// error (and a TypeError at run time: "is not a function"); a wrong argument type is a type
// error, or a TypeError where node-redis or the client checks it at run time. A call returns
// nothing: the reply is never seen. `delivery.queue(name, ...args)` stays for what node-redis
// lacks.

import type COMMANDS from "@redis/client/dist/lib/commands";
import type { Arg } from "./window-client";

type Commands = typeof COMMANDS;
type Tail<T> = T extends [unknown, ...infer R] ? R : never;

/** node-redis's commands, each queued on one delivery instead of being sent. */
export type RedisCommands = {
  readonly [K in keyof Commands]: (...args: Tail<Parameters<Commands[K]["parseCommand"]>>) => void;
};

interface Parser {
  readonly redisArgs: ReadonlyArray<string | Buffer>;
}
type Queue = (name: string, ...args: Arg[]) => unknown;
type Command = { parseCommand: (parser: Parser, ...args: unknown[]) => void };

let prototype: object | undefined;

/** The object all recorders share: one method per node-redis command (loaded on first use). */
function commandPrototype(): object {
  if (prototype !== undefined) return prototype;
  // Loaded here, not at import: a client that never uses delivery.redis does not pay for it.
  const commands = (require("@redis/client/dist/lib/commands") as { default: Record<string, Command> }).default;
  const { BasicCommandParser } = require("@redis/client/dist/lib/client/parser") as { BasicCommandParser: new () => Parser };
  const proto: Record<string, unknown> = {};
  for (const [name, command] of Object.entries(commands)) {
    if (typeof command?.parseCommand !== "function") continue;
    proto[name] = function (this: { queue: Queue }, ...args: unknown[]): void {
      const parser = new BasicCommandParser();
      command.parseCommand(parser, ...args);
      const [head, ...rest] = parser.redisArgs;
      this.queue(String(head), ...rest);
    };
  }
  prototype = proto;
  return proto;
}

/** @internal The recorder of one delivery's `redis`. */
export function redisCommands(queue: Queue): RedisCommands {
  const recorder = Object.create(commandPrototype()) as { queue: Queue };
  Object.defineProperty(recorder, "queue", { value: queue, enumerable: false });
  return recorder as unknown as RedisCommands;
}
