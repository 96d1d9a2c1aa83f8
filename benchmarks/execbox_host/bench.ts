// Side by side through execbox's TypeScript host (RemoteExecutor over the ws transport): see execbox_host.py.
import { resolveProvider } from "@execbox/core";
import { RemoteExecutor } from "@execbox/remote";
import { connectWsTransport } from "./wsTransport";

const url = process.argv[2];
const callTimes: number[] = [];
const which = (process.argv[3] ?? "a,b,c").split(",");
const label = process.argv[4] ?? url;
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

if (which.includes("a")) {
  const N = 1000;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const lat: number[] = [];
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

if (which.includes("b")) {
  const b: Record<string, unknown> = {};
  for (const n of [0, 1, 10]) {
    const code = n === 0 ? "1+1" : `let s = 0; for (let i = 0; i < ${n}; i++) s = (await t.inc({ i: s })).v; s`;
    const lat: number[] = [];
    let fails = 0;
    const deadline = performance.now() + 6000; // bounded: at most 300 runs or 6 s
    for (let k = 0; k < 10; k++) await ex.execute(code, [provider]); // warm-up
    while (lat.length < 300 && performance.now() < deadline) {
      const s = performance.now();
      const r: any = await ex.execute(code, [provider]);
      lat.push(performance.now() - s);
      if (!r.ok || r.result !== (n === 0 ? 2 : n)) fails++;
    }
    b[`calls_${n}`] = { runs: lat.length, fails, p50_ms: +pct(lat, 0.5).toFixed(2), p90_ms: +pct(lat, 0.9).toFixed(2) };
  }
  out.b = b;
}

if (which.includes("c")) {
  const C = 64, DUR = 5000;
  const clat: number[] = [];
  let done = 0, fails = 0;
  const failRs: any[] = [];
  const t0 = performance.now();
  const end = t0 + DUR;
  await Promise.all(Array.from({ length: C }, async () => {
    while (performance.now() < end) {
      const s0 = performance.now();
      const r: any = await ex.execute("1+1", [provider]);
      clat.push(performance.now() - s0);
      if (r.ok && r.result === 2) done++; else { fails++; if (failRs.length < 50) failRs.push(r); }
    }
  }));
  const el = performance.now() - t0;
  out.c = { concurrency: C, elapsed_ms: Math.round(el), completed: done, fails, per_s: Math.round((done * 1000) / el), p50_ms: +pct(clat, 0.5).toFixed(1), p99_ms: +pct(clat, 0.99).toFixed(1), max_ms: Math.round(Math.max(...clat)), failure_kinds: tally(failRs) };
}
console.log(JSON.stringify(out));
process.exit(0);
