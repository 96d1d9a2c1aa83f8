// Side by side through execbox's TypeScript host (RemoteExecutor over the ws transport): see execbox_host.py.
import { resolveProvider } from "@execbox/core";
import { RemoteExecutor } from "@execbox/remote";
import { connectWsTransport } from "./wsTransport";

const url = process.argv[2];
const callTimes: number[] = [];
const which = (process.argv[3] ?? "a,b,c").split(",");
const label = process.argv[4] ?? url;
const concurrency = Number(process.argv[5] ?? 64);
const provider = resolveProvider({
  name: "t",
  tools: {
    wait2s: { execute: async () => { callTimes.push(performance.now()); return new Promise((r) => setTimeout(() => r({ ok: 1 }), 2000)); } },
    inc: { execute: async (input) => ({ v: (input as { i: number }).i + 1 }) },
  },
});
const ex = new RemoteExecutor({ connectTransport: () => connectWsTransport({ url, addMissingInput: true }), timeoutMs: 30_000 });
const out: Record<string, unknown> = { label, url };
const tally = (rs: any[]) => {
  const m: Record<string, number> = {};
  for (const r of rs) if (!r.ok) { const k = `${r.error?.code}: ${String(r.error?.message).slice(0, 80)}`; m[k] = (m[k] ?? 0) + 1; }
  return m;
};
const pct = (xs: number[], p: number) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(p * s.length))]; };

// The tool-call workloads: guest code and its expected result. "p10" is ten calls at once (Promise.all).
const workloads: Record<string, [string, number]> = {
  "0": ["1+1", 2],
  "1": ["(await t.inc({ i: 0 })).v", 1],
  "10": ["let s = 0; for (let i = 0; i < 10; i++) s = (await t.inc({ i: s })).v; s", 10],
  p10: ["(await Promise.all(Array.from({ length: 10 }, (_, i) => t.inc({ i })))).reduce((s, r) => s + r.v, 0)", 55],
};
let executions = 0; // every execution this run sent, warm-up included: the runner's CPU is divided by it
const run = async (name: string) => {
  const [code, expected] = workloads[name];
  executions++;
  const r: any = await ex.execute(code, [provider]);
  return { r, ok: r.ok && r.result === expected };
};

if (which.includes("a")) {
  const N = 1000;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const lat: number[] = [];
  executions += N;
  const rs = await Promise.all(Array.from({ length: N }, async () => {
    const s = performance.now();
    const r = await ex.execute("(await t.wait2s({})).ok", [provider]);
    lat.push(performance.now() - s);
    return r;
  }));
  const wall = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const bad = rs.filter((r: any) => !(r.ok && r.result === 1));
  const ct = callTimes.map((x) => x - t0);
  out.a = { n: N, wall_ms: Math.round(wall), host_cpu_ms: Math.round((cpu.user + cpu.system) / 1000), first_call_ms: Math.round(Math.min(...ct)), last_call_ms: Math.round(Math.max(...ct)), calls: ct.length, failures: bad.length, failure_kinds: tally(bad), p50_ms: Math.round(pct(lat, 0.5)), max_ms: Math.round(Math.max(...lat)) };
  await new Promise((r) => setTimeout(r, 1000));
}

// "b": latency with each workload; "b0": with 1+1 alone (for a server that runs nothing).
if (which.includes("b") || which.includes("b0")) {
  const b: Record<string, unknown> = {};
  for (const n of which.includes("b") ? ["0", "1", "10", "p10"] : ["0"]) {
    const lat: number[] = [];
    let fails = 0;
    const deadline = performance.now() + 6000; // bounded: at most 300 runs or 6 s
    for (let k = 0; k < 10; k++) await run(n); // warm-up
    while (lat.length < 300 && performance.now() < deadline) {
      const s = performance.now();
      const { ok } = await run(n);
      lat.push(performance.now() - s);
      if (!ok) fails++;
    }
    b[n] = { runs: lat.length, fails, p50_ms: +pct(lat, 0.5).toFixed(2), p90_ms: +pct(lat, 0.9).toFixed(2) };
  }
  out.b = b;
}

// "c", "c1", "c10", "cp10": the workload ("c" is "1+1") at the given concurrency for 5 s.
for (const section of which.filter((w) => /^c(p?\d+)?$/.test(w))) {
  const name = section === "c" ? "0" : section.slice(1);
  const DUR = 5000;
  const clat: number[] = [];
  let done = 0, fails = 0;
  const failRs: any[] = [];
  const t0 = performance.now();
  const end = t0 + DUR;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (performance.now() < end) {
      const s0 = performance.now();
      const { r, ok } = await run(name);
      clat.push(performance.now() - s0);
      if (ok) done++; else { fails++; if (failRs.length < 50) failRs.push(r); }
    }
  }));
  const el = performance.now() - t0;
  out[section] = { workload: name, concurrency, elapsed_ms: Math.round(el), completed: done, fails, per_s: Math.round((done * 1000) / el), p50_ms: +pct(clat, 0.5).toFixed(1), p99_ms: +pct(clat, 0.99).toFixed(1), max_ms: Math.round(Math.max(...clat)), failure_kinds: tally(failRs) };
}
out.executions = executions;
console.log(JSON.stringify(out));
process.exit(0);
