// `--only tcp-audit` (issue 48, docs/network.md "Raw TCP in the audit trail"): what one harvest of
// a sandbox's raw-TCP sets costs (the `nsenter … nft -j list table` and the parse), with the sets
// empty and holding 1000 and 2000 connections (a full set: TCP_AUDIT_SET_SIZE), in a network namespace of the bench's own with the
// sandbox's real table (root only; nothing leaves it). CPU time, not wall time: the machine is
// shared. Kernel memory per element is not measured here: with sandboxes coming and going on the
// machine, the slab moves by more than a few thousand elements take (docs/network.md has a
// figure from repeated adds and flushes of 32 000).

import { spawn } from 'node:child_process';
import { readFileSync, readlinkSync } from 'node:fs';
import { EgressRules } from '../../src/egress/policy.js';
import { applyRuleset, sandboxRuleset } from '../../src/egress/sandbox-net.js';
import { TcpAudit } from '../../src/egress/tcp-audit.js';
import type { BenchReport } from '../runner.js';
import { round } from '../stats.js';

export interface TcpAuditFigures {
  /** Connections in the sets (each an element in raw_out and raw_in). */
  connections: number;
  /** CPU of nsenter and nft per harvest, ms. */
  nftCpuMs: number;
  /** CPU of this process per harvest (reading and parsing the listing), ms. */
  parseCpuMs: number;
}

/**
 * CPU of this process's waited-for children so far, ms (cutime + cstime of /proc/self/stat, in
 * clock ticks of 10 ms: the runs add up to well over that).
 */
function childCpuMs(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[13]) + Number(fields[14])) * 10;
}

export async function tcpAuditCost(report: BenchReport): Promise<TcpAuditFigures[]> {
  if (process.getuid?.() !== 0) {
    report.log('tcp-audit: skipped (needs root for a network namespace)');
    return [];
  }
  const holder = spawn('unshare', ['--net', '--', 'sleep', 'infinity'], { stdio: 'ignore' });
  const net = { holder: holder.pid as number, userns: false };
  const figures: TcpAuditFigures[] = [];
  try {
    // Until `unshare` has its namespace (a loaded machine may take longer than a moment);
    // applyRuleset refuses the bench's own namespace either way.
    const own = readlinkSync('/proc/self/ns/net');
    for (let waited = 0; waited < 10_000; waited += 20) {
      const theirs = (() => {
        try {
          return readlinkSync(`/proc/${net.holder}/ns/net`);
        } catch {
          return own;
        }
      })();
      if (theirs !== own) break;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    await applyRuleset(
      net,
      sandboxRuleset({ allowOut: [], denyOut: [] }, { http: 1, tls: 2, dns: 3 }),
    );
    const audit = new TcpAudit({
      rules: new EgressRules(),
      policy: () => undefined,
      push: () => undefined,
      dropped: () => undefined,
    });
    const runs = report.quick ? 5 : 20;
    let filled = 0;
    for (const connections of [0, 1000, 2000]) {
      // Elements as the packet path makes them, added in batches (one port per connection).
      for (let from = filled; from < connections; from += 500) {
        const batch: string[] = [];
        for (let j = from; j < Math.min(connections, from + 500); j++) {
          batch.push(`203.0.${Math.floor(j / 250)}.${(j % 250) + 1} . 22 . ${1024 + j}`);
        }
        await applyRuleset(
          net,
          ['raw_out', 'raw_in']
            .map((set) => `add element inet abx ${set} { ${batch.join(', ')} }\n`)
            .join(''),
        );
      }
      filled = connections;
      const nftBefore = childCpuMs();
      const ours = process.cpuUsage();
      for (let i = 0; i < runs; i++) await audit.harvest('bench', net);
      const own = process.cpuUsage(ours);
      figures.push({
        connections,
        nftCpuMs: round((childCpuMs() - nftBefore) / runs, 1),
        parseCpuMs: round((own.user + own.system) / 1000 / runs, 1),
      });
    }
    report.log(
      `tcp-audit: per harvest ${figures.map((f) => `${f.connections} connections: nft ${f.nftCpuMs} ms, parse ${f.parseCpuMs} ms`).join('; ')}`,
    );
    for (const f of figures) {
      report.row(
        'raw TCP audit harvest',
        `${f.connections} connections`,
        `nft ${f.nftCpuMs} ms CPU · parse ${f.parseCpuMs} ms CPU`,
      );
    }
    report.results.tcpAudit = figures;
    return figures;
  } finally {
    holder.kill('SIGKILL');
  }
}
