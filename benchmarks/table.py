"""The latest results as Markdown tables, from the JSON files in benchmarks/results.

    python benchmarks/table.py            # print the tables
    python benchmarks/table.py --write    # rewrite the tables section of benchmarks/README.md

One section per results file (<bench>-<device>.json): the machine, versions, date and command it
records, then its rows. Reads the files as the benchmarks write them (machine, versions) and the
older ones (environment).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
README = os.path.join(HERE, "README.md")
BEGIN, END = "<!-- tables: begin (written by benchmarks/table.py) -->", "<!-- tables: end -->"
ORDER = ["cifar", "exact", "exact-loop", "exact-stride12", "exact-cold", "estimate", "gradient", "responsibility",
         "responsibility-ours", "onnx",
         "text", "text-gradient", "scale"]


def fmt(v, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def table(head: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows]


def exact_rows(doc: dict) -> list[str]:
    configs = [r for r in doc["rows"] if "fast_s" in r and r.get("case") != "loop_cost"]
    loops = [r for r in doc["rows"] if r.get("case") == "loop_cost"]
    out = []
    if loops:
        out += table(["config (the loop's own cost)", "N", "p", "forward calls", "image-steps", "fast s", "floor s",
                      "fast/floor", "loop us per call", "of which step kernels", "of which host",
                      "loop us per image-step", "ops per call outside the model",
                      "batch shapes"],
                     [[r["config"], r["images"], r["features"], r["calls"], r["image_steps"], r["fast_s"],
                       r["floor_s"], r["fast_over_floor"], r["loop_us_per_call"],
                       sum(r["kernels_us_per_call"].values()) if "kernels_us_per_call" in r else None,
                       r.get("host_us_per_call"), r["loop_us_per_image_step"],
                       r.get("ops_outside_per_call"), r.get("batch_shapes")]
                      for r in loops]) + [""]
    if configs:
        out += table(["config", "N", "p", "candidates", "B", "fast s", "floor s", "fast/floor",
                      "fast/floor (channels_last copy)", "reference s", "reference/fast", "same SIS", "engine (fast)"],
                     [[r["config"], r["images"], r["features"], r["candidates"], r["batch_size"], r["fast_s"],
                       r["floor_s"], r["fast_over_floor"], r.get("fast_over_floor_cl"), r.get("reference_s"),
                       r.get("speedup_vs_reference"), r.get("fast_same_sis_as_reference", r.get("same_order")),
                       r.get("engine_used", {}).get("fast", "-")]
                      for r in configs])
    for r in doc["rows"]:
        if isinstance(r.get("call_s"), dict):  # the cold case
            out += ["", f"Cold: {r['config']} ({r['candidates']} candidates), a fresh process per run, "
                        f"minima over {r['rounds']} rounds:", ""]
            out += table(["contender", "call s", "process s", "call / reference's", "same SIS"],
                         [[k, r["call_s"][k], r["process_s"][k], r.get("over_reference", {}).get(k),
                           r["same_sis"][k]] for k in r["call_s"]])
    return out


def cifar_rows(doc: dict) -> list[str]:
    """The CIFAR-10 workload (bench_cifar.py): rates against the ceiling, bf16, and the projections (labelled)."""
    out = []
    for r in doc["rows"]:
        f32, low = r.get("float32_info") or {}, r.get("bf16_info") or {}
        out += table(["config", "N", "p", "candidates", "float32 rows/s", "bf16 rows/s", "bf16/float32", "re-scored",
                      "ceiling rows/s", "of ceiling", "B (float32, bf16)", "engine", "channels_last",
                      "same SIS"],
                     [[r["config"], r["images"], r["features"], r["candidates"], fmt(r.get("rows_per_s"), 0),
                       fmt(r.get("bf16_rows_per_s"), 0), r.get("bf16_over_float32"),
                       "-" if r.get("rescored_share") is None else f"{100 * r['rescored_share']:.1f}%",
                       fmt(r.get("ceiling_rows_per_s"), 0), r.get("fraction_of_ceiling"),
                       f"{f32.get('batch_size', '-')}, {low.get('batch_size', '-')}", f32.get("engine", "-"),
                       "-" if f32.get("channels_last") is None else ("yes" if f32["channels_last"] else "no"),
                       r.get("same_sis_as_float32")]])
        if "projected_hours_10000" in r:
            out += ["", f"{r['images_per_hour']:.0f} images per hour; {r['projection']}: "
                        f"{r['projected_hours_10000']:.2f} h for 10,000 and {r['projected_hours_60000']:.2f} h for "
                        f"60,000 (a projection, not a measurement of them)."]
        if low.get("low"):
            lp = low["low"]
            out += ["", f"bf16: K = {lp['rescore_k']} candidates re-scored per step, m = {lp['margin']:.3g}"
                        + ("; declined (the first step predicted more than half re-scored)" if lp["declined"] else "")
                        + "."]
    return out


def gradient_rows(doc: dict) -> list[str]:
    if not any("contenders" in r for r in doc["rows"]):  # files written before the contenders were listed
        return table(["model", "N", "size", "k", "fast s", "transcription s", "speedup", "same SIS", "verified"],
                     [[r["model"], r["images"], r["size"], r["k"], r["fast_s"], r["transcription_s"], r["speedup"],
                       r["same_sis"], r.get("verified")] for r in doc["rows"]])
    rows = []
    for r in doc["rows"]:
        ref = r["contenders"].get("transcription", {})
        for name, c in r["contenders"].items():
            if name != "transcription":
                rows.append([r["model"], r["size"], r["k"], name, c["images"], c["s_per_image"], ref.get("images"),
                             ref.get("s_per_image"), c.get("speedup"), c.get("same_sis"), c["verified"]])
    out = table(["model", "size", "k", "contender", "N", "s per image", "N (transcription)",
                 "transcription s per image", "speedup", "same SIS", "verified"], rows)
    ceilings = [r for r in doc["rows"] if r.get("step_ceiling_float32")]
    if ceilings:  # the float32 step's model work: one image as given against the batch
        out += ["", "A float32 step's model work (masked forward, softmax, backward to the mask), s per image:", ""]
        out += table(["model", "k", "one image, model as given", "batched, the steps' model", "batching gains at most"],
                     [[r["model"], r["k"], r["step_ceiling_float32"]["transcription_step_s"],
                       r["step_ceiling_float32"]["batched_step_s_per_image"], r["step_ceiling_float32"]["ceiling"]]
                      for r in ceilings])
    return out


def responsibility_rows(doc: dict) -> list[str]:
    s = doc["summary"]
    pct = lambda v: "-" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    if "rex_time_per_image_s" not in s:  # ours alone
        out = table(["photos", "s per image", "floor s per image", "ours/floor", "queries (median)", "MPS (median)",
                     "every MPS passes"],
                    [[s["photos"], s["ours_time_per_image_s"], s["ours_floor_per_image_s"], s["ours_over_floor"],
                      s["ours_median_queries"], pct(s["ours_median_mps_fraction"]), s["ours_all_pass_on_model"]]])
        a = s.get("against")
        if a:  # an earlier run beside ReX: its recorded figures, not side by side
            side = a["side_by_side"]
            out += ["", f"Against {a['path']} (commit {a['commit'][:7]}, {a['date']}): ReX's time from that run's "
                        f"side-by-side rounds, ours now on the same photos and seeds: {side['rex_s_per_image']:.2f} "
                        f"against {side['ours_now_s_per_image']:.2f} s per image, {side['ratio']:.2f}x (then "
                        f"{side['ratio_then']:.2f}x); {a['rex_median_queries']:.0f} queries, {a['query_ratio']:.2f}x "
                        f"fewer; the same sets: {fmt(a['same_mps_as_recorded'])}, the same queries: "
                        f"{fmt(a['same_queries_as_recorded'])}"]
        return out
    seeds = len(s["rex_seeds"])
    rows = [[f"ReX, {seeds} seeds", s["rex_median_queries"], s["rex_time_per_image_s"], pct(s["rex_median_mps_fraction"]),
             f"{s['rex_seed_to_seed_dice']:.3f} (seed to seed)"],
            [f"ours, {seeds} seeds", s["ours_median_queries"], s["ours_time_per_image_s"],
             pct(s["ours_median_mps_fraction"]), f"{s['ours_dice_to_rex']:.3f}"]]
    out = table(["", "queries per image (median)", "s per image", "MPS (median)", "Dice to ReX"], rows)
    out += ["", f"{s['photos']} photos; ours {s['speed_ratio']:.2f}x faster, {s['query_ratio']:.2f}x fewer queries; "
                f"every MPS passes: {fmt(s['ours_all_pass_on_model'])}"
                + (f"; ours / its bare forward passes: {s['ours_over_floor']:.2f}" if "ours_over_floor" in s else "")]
    st = s.get("steadiness")
    if st:  # per photo, then the median and quartiles over photos
        def spread(d, k=1.0):
            if not d:
                return "-"
            f = ".0f" if abs(k * d["median"]) >= 100 else ".2f"
            return f"{k * d['median']:{f}} ({k * d['q25']:{f}}-{k * d['q75']:{f}})"

        lines = [["seed Dice (mean pairwise, per photo)", spread(st.get("rex_seed_dice")), spread(st.get("ours_seed_dice"))],
                 [f"noise Dice ({st.get('noise_copies')} copies, sigma {st.get('noise_sigma')})",
                  spread(st.get("rex_noise_dice")), spread(st.get("ours_noise_dice"))],
                 ["queries per image", spread(st.get("rex_queries")), spread(st.get("ours_queries"))],
                 ["MPS, % of the image", spread(st.get("rex_mps_fraction"), 100), spread(st.get("ours_mps_fraction"), 100)]]
        out += ["", "Steadiness, median over photos (interquartile range):", ""]
        out += table(["", "ReX", "ours"], lines)
    return out


def onnx_rows(doc: dict) -> list[str]:
    return table(["config", "N", "p", "candidates", "torch s", "onnx s", "onnx/torch", "torch floor s",
                  "onnx floor s", "same SIS"],
                 [[r["config"], r["images"], r["features"], r["candidates"], r["torch_s"], r["onnx_s"],
                   r["onnx_over_torch"], r["torch_floor_s"], r["onnx_floor_s"], r["same_sis"]] for r in doc["rows"]])


def text_rows(doc: dict) -> list[str]:
    return table(["contender", "sequences", "min s", "vs reference", "same reduction", "same beam"],
                 [[r["contender"], r["sequences"], r["seconds_min"], r.get("speedup_vs_reference"),
                   r.get("same_reduction"), r.get("same_beam")] for r in doc["rows"] if "contender" in r])


def scale_rows(doc: dict) -> list[str]:
    out = table(["contender", "images", "s (min)", "images/s"],
                [[r["contender"], r["images"], r["seconds"], r["images_per_s"]] for r in doc["rows"]
                 if "contender" in r])
    summary = next((r for r in doc["rows"] if "scaling_efficiency_2" in r), None)
    if summary:
        out += ["", f"Scaling efficiency with 2 processes {summary['scaling_efficiency_2']:.2f}; durability cost "
                    f"{100 * summary['durability_cost']:+.1f}% (wall)."]
    return out


def estimate_rows(doc: dict) -> list[str]:
    return table(["config", "N", "p", "run", "path", "channels_last", "estimate s", "measured s", "measured/estimate"],
                 [[r["config"], r["images"], r["features"], i,
                   x["step"] if x["step"] == x["engine"] else f"{x['engine']}, {x['step']}",
                   "on" if x["channels_last"] else "off",
                   x["estimate_s"], x["measured_s"], x["ratio"]]
                  for r in doc["rows"] for i, x in enumerate(r["runs"])])


RENDER = {"cifar": cifar_rows, "estimate": estimate_rows, "exact": exact_rows, "exact-cold": exact_rows, "exact-loop": exact_rows,
          "exact-stride12": exact_rows, "gradient": gradient_rows,
          "responsibility": responsibility_rows, "responsibility-ours": responsibility_rows, "onnx": onnx_rows,
          "text": text_rows, "text-gradient": text_rows,
          "scale": scale_rows}


def describe(doc: dict) -> str:
    """'<CPU> (<cores> cores)[, <GPU>]; torch X, onnxruntime Y[, ReX Z]; <date>'"""
    m = doc.get("machine") or doc.get("environment", {})
    v = doc.get("versions") or doc.get("environment", {})
    where = f"{m.get('cpu', '?')} ({m.get('cores', m.get('cpus', '?'))} cores)" + (f", {m['gpu']}" if m.get("gpu") else "")
    soft = ", ".join(f"{k} {v[k]}" for k in ("torch", "onnxruntime", "rex-xai") if v.get(k))
    rex = (doc.get("rex") or {}).get("versions", {}).get("rex-xai")
    if rex and "rex-xai" not in v:
        soft += f", ReX {rex}"
    return f"{where}; {soft}; {doc.get('date', '?')}"


def sections() -> list[str]:
    files = sorted(glob.glob(os.path.join(RESULTS, "*.json")))
    key = lambda f: (ORDER.index(re.sub(r"-(cpu|cuda)$", "", os.path.basename(f)[:-5]))  # noqa: E731
                     if re.sub(r"-(cpu|cuda)$", "", os.path.basename(f)[:-5]) in ORDER else len(ORDER), f)
    out = []
    for path in sorted(files, key=key):
        name = os.path.basename(path)[:-5]
        bench = re.sub(r"-(cpu|cuda)$", "", name)
        if bench not in RENDER:
            continue
        with open(path) as fh:
            doc = json.load(fh)
        out += [f"### {name}", "", f"{describe(doc)}. `{doc.get('command', '?')}` ([JSON](results/{name}.json))", ""]
        out += RENDER[bench](doc) + [""]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="rewrite the tables section of benchmarks/README.md")
    args = ap.parse_args()
    text = "\n".join(sections()).rstrip() + "\n"
    if not args.write:
        print(text, end="")
        return
    with open(README) as fh:
        page = fh.read()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{README} has no tables section ({BEGIN} ... {END})")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(README, "w") as fh:
        fh.write(f"{head}{BEGIN}\n\n{text}\n{END}{tail}")
    print(f"rewrote the tables of {README}")


if __name__ == "__main__":
    main()
