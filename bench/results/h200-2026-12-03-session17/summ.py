"""One line per bench JSON under /tmp/res: tok/s (runs), stall, disk bytes, read rate in stall, prefetch, probes, ratios."""
import glob, json, os, sys
for f in sorted(glob.glob(sys.argv[1] if len(sys.argv) > 1 else "/tmp/res/hypura-*.json"), key=os.path.getmtime):
    d = json.load(open(f)); s = d["stats"]["decode"]; p = d["stats"].get("expert_paging", {}); pf = p.get("prefetch", {})
    probe = d.get("disk_probe") or {}
    print(os.path.basename(f), f"{d['decode_tok_s']['median']:.2f} ({', '.join(f'{r:.2f}' for r in d['decode_tok_s']['runs'])})", f"stall {s['stall_ms_per_token']:.0f} ms",
          f"disk {s['streamed_bytes_per_token'].get('disk', 0)/1e9:.3f} GB", f"in-stall {p.get('read_gbps_in_stall', 0):.2f} GB/s",
          f"pf {pf.get('issued')} prec {pf.get('precision', 0):.2f} rec {pf.get('recall', 0):.2f} waits {pf.get('waits')}",
          "probe", *(f"{probe[k]['gbps']:.2f}" for k in ("before", "after") if k in probe),
          f"ratio {d.get('bound_ratio') or 0:.2f} now {d.get('bound_now_ratio') or 0:.2f}")
