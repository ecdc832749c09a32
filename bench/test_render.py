#!/usr/bin/env python3
"""Unit tests of render.py on the committed schema fixtures (bench/fixtures/schema-fixture-*.json,
whose numbers are invented). Run from anywhere: `python3 bench/test_render.py`; CI runs it
through tests/bench_cli.rs."""
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import render  # noqa: E402

FIXTURES = [os.path.join(HERE, "fixtures", f"schema-fixture-{n}.json") for n in ("glmc", "peer", "matmul", "gemv", "attention", "gemm", "indexer")]


class RenderTest(unittest.TestCase):
    def setUp(self):
        self.docs = render.load(FIXTURES)
        self.text = render.render(self.docs)

    def test_a_fixture_is_never_presented_as_a_result(self):
        self.assertIn("**SCHEMA FIXTURE, NOT A RESULT**", self.text.splitlines()[2])

    def test_real_files_carry_no_fixture_banner(self):
        docs = render.load(FIXTURES)
        for ds in docs.values():
            for d in ds:
                d.pop("fixture")
        self.assertNotIn("FIXTURE", render.render(docs))

    def test_every_section_is_there(self):
        for heading in ["## Runs", "## Decode", "## Prefill", "## Launch overhead", "## Per kernel",
                        "## transformers (GlmMoeDsaForCausalLM)", "## torch.matmul on glmc's GEMM shapes",
                        "## Decode GEMMs under issue 14's protocol", "## Prefill GEMMs under issue 14's protocol",
                        "## Absorbed attention at batch 64", "## Indexer scoring at decode"]:
            self.assertIn(heading, self.text)

    def test_decode_rows_put_glmc_both_paths_and_the_peers_side_by_side(self):
        row = next(l for l in self.text.splitlines() if l.startswith("| 1 | 1024 |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        # batch, context, sparse (ms, tok/s, roofline ms, of roofline, predicted: from the CUDA
        # graph step), dense (same), HF eager (ms, tok/s), HF reduce-overhead (failed: dashes)
        self.assertEqual(cells, ["1", "1024", "1.600", "625.0", "1.000", "62.5%", "1.100",
                                 "1.680", "595.2", "1.000", "59.5%", "1.100", "50.000", "20.0", "—", "—"])

    def test_a_decode_point_without_a_graph_step_takes_its_launched_step(self):
        point = {"step_s": {"median": 2.0}, "graph_step_s": None}
        self.assertEqual(render.decode_latency(point), 2.0)
        point["graph_step_s"] = {"median": 1.5}
        self.assertEqual(render.decode_latency(point), 1.5)

    def test_targets_are_judged_from_the_measured_numbers(self):
        section = self.text.split("## Targets (issue 14)")[1].split("\n## ")[0]
        rows = {r.split(" | ")[0].strip("| "): r.split(" | ")[1:] for r in section.splitlines() if r.startswith("| decode")}
        # 1.000 ms of roofline in a 1.600 ms graph step; the eager peer's 50 ms is the best that ran.
        self.assertEqual(rows["decode, batch 1, context 1024, sparse: ≥ 75% of the roofline"], ["62.5%", "missed |"])
        self.assertEqual(
            rows["decode, batch 1, context 1024, sparse: faster than the best PyTorch peer"],
            ["1.600 ms against eager's 50.000 ms", "met |"],
        )
        # The decode GEMM targets come from the sweep under the protocol, at 1–8 rows only: o_proj
        # moved 201.4 MB in 55 µs (91.5% of 4000 GB/s), wq_b 16.9 MB in 6 µs (70.4%) and took 1.2×
        # torch's time; the 64-row o_proj, slower still, is outside the target.
        self.assertEqual(
            rows["decode GEMMs, 1–8 rows, weights of 64 MB or more: ≥ 85% of the copy bandwidth"],
            ["91.5% at the worst, `model.layers.*.self_attn.o_proj` at 1 rows", "met |"],
        )
        self.assertEqual(
            rows["decode GEMMs, 1–8 rows, weights of under 64 MB: ≥ 75% of the copy bandwidth"],
            ["70.4% at the worst, `model.layers.*.self_attn.indexer.wq_b+rope` at 8 rows", "missed |"],
        )
        self.assertEqual(
            rows["decode GEMMs, 1–8 rows: never slower than torch.matmul under the same rotation"],
            ["1 of 2 slower; worst `model.layers.*.self_attn.indexer.wq_b+rope` at 8 rows, 1.20×", "missed |"],
        )
        self.assertNotIn("decode GEMMs never slower than torch.matmul", rows)

    def prefill_target(self, text):
        section = text.split("## Targets (issue 14)")[1].split("\n## ")[0]
        return next(r for r in section.splitlines() if r.startswith("| prefill bf16 GEMMs"))

    def test_the_prefill_gemm_target_is_judged_from_the_sweep_where_it_ran(self):
        # The sweep's shipped q_b_proj took 2× torch's 400 µs (50%); its faster "best" tile and
        # the in-model 1000 µs of matmul.json are not what the target judges.
        self.assertEqual(
            self.prefill_target(self.text),
            "| prefill bf16 GEMMs ≥ 50% of torch.matmul's rate | 50.0% at the worst, "
            "`model.layers.*.self_attn.q_b_proj+rope` (each shape alone, as torch.matmul, on Fixture GPU) | met |",
        )
        section = self.text.split("## Prefill GEMMs under issue 14's protocol")[1].split("\n## ")[0]
        self.assertIn("| `model.layers.*.mlp.down_proj` | 1 × 6144 × 12288 | 256x128 w4x2 k32 s4 b1 g1 | 1,250.0 |", section)
        self.assertNotIn("[best", section)
        self.assertNotIn("| prefill", self.text.split("## Decode GEMMs under issue 14's protocol")[1].split("\n## ")[0])

    def test_without_the_sweep_the_prefill_gemm_target_takes_the_in_model_times(self):
        docs = render.load([f for f in FIXTURES if not f.endswith("gemm.json")])
        self.assertEqual(
            self.prefill_target(render.render(docs)),
            "| prefill bf16 GEMMs ≥ 50% of torch.matmul's rate | 40.0% at the worst, "
            "`model.layers.*.self_attn.q_b_proj+rope` (in the model) | missed |",
        )

    def test_the_absorbed_attention_targets_are_judged_from_the_gpu_test(self):
        section = self.text.split("## Targets (issue 14)")[1].split("\n## ")[0]
        rows = [r for r in section.splitlines() if r.startswith("| absorbed attention")]
        # 8 heads: 160 MB in 50 µs is 3.2 TB/s, 80% of the 4 TB/s copy; 64 heads: a 40 µs
        # roofline in 100 µs. The 16-head variant's 200 µs is not what the target judges.
        self.assertEqual(
            rows,
            [
                "| absorbed attention, batch 64, context 32768, 8 heads: ≥ 80% of the copy bandwidth | 80.0% (50.0 us on Fixture GPU) | met |",
                "| absorbed attention, batch 64, context 32768, 64 heads: ≥ 60% of its roofline | 40.0% (100.0 us on Fixture GPU) | missed |",
            ],
        )
        table = self.text.split("## Absorbed attention at batch 64")[1].split("\n## ")[0]
        # A case without a gather ceiling shows dashes; the 8-head one's 40 µs is 80% of its 50.
        self.assertIn("| decode (16 heads a block) | 64 | 32768 | glmc_mla_absorbed_2,glmc_mla_merge_1 | 200.0 | 800 | 20.0% | — | — |", table)
        self.assertIn("| decode | 8 | 32768 | glmc_mla_absorbed_3,glmc_mla_merge_2 | 50.0 | 3,200 | 80.0% | 40.0 | 80.0% |", table)
        self.assertNotIn("prefill", table)
        self.assertNotIn("| decode | 64 | 32768 | glmc_mla_absorbed_wide_1,glmc_mla_merge_1 | 10.0 |", table)

    def test_the_indexer_target_is_judged_from_the_gpu_test(self):
        section = self.text.split("## Targets (issue 14)")[1].split("\n## ")[0]
        rows = [r for r in section.splitlines() if "indexer scoring" in r]
        # A 15 µs roofline in the shipped ring's 20 µs; the 6 × 64 ring's 30 µs is not judged.
        self.assertEqual(
            rows,
            ["| decode, batch 8, context 32768: indexer scoring ≥ 70% of its roofline | 75.0% (20.0 us on Fixture GPU, the GPU test) | met |"],
        )
        table = self.text.split("## Indexer scoring at decode")[1].split("\n## ")[0]
        self.assertIn("| decode 8 × 32768 | 6 × 64 keys | glmc_dsa_score_decode_2 | 30.0 | 2,000 | 50.0% |", table)
        for absent in ("dsa_topk", "prefill", "decode 1 × 32768"):
            self.assertNotIn(absent, table)

    def test_the_bench_judges_the_indexer_where_its_test_did_not_run_and_is_shown_beside_it(self):
        what = "decode, batch 8, context 32768: indexer scoring ≥ 70% of its roofline"
        self.assertEqual(render.indexer_targets({render.INDEXER: []}, 0.631), [[what, "63.1%", "missed"]])
        self.assertEqual(render.indexer_targets({render.INDEXER: []}, None), [])
        [row] = render.indexer_targets(self.docs, 0.631)
        self.assertEqual(row[1], "75.0% (20.0 us on Fixture GPU, the GPU test; the bench's kernels, each between events of its own: 63.1%)")

    def test_the_gaps_put_the_op_most_over_its_roofline_first(self):
        section = self.text.split("### Where batch 1 loses its time")[1].split("\n## ")[0]
        rows = [r for r in section.splitlines() if r.startswith("| ") and not r.startswith("| op")]
        over = [float(r.split(" | ")[4].replace(",", "")) for r in rows[:2]]
        self.assertGreaterEqual(over[0], over[1])
        self.assertIn("context 1024, sparse", section)

    def test_points_a_run_lacks_are_dashes(self):
        row = next(l for l in self.text.splitlines() if l.startswith("| 1 | 8192 |"))
        self.assertEqual(row.count("—"), 9)

    def test_launch_overhead_is_step_minus_sum_of_kernels(self):
        row = next(l for l in self.text.splitlines() if l.startswith("| dense | decode | 1 | 1024 |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cells[4:], ["9", "2.100", "2.037", "0.566", "1.534", "73.0%", "1.680", "20.0%"])
        # Prefill has no CUDA graph.
        row = next(l for l in self.text.splitlines() if l.startswith("| sparse | prefill |"))
        self.assertTrue(row.endswith("| — | — |"))

    def test_per_kernel_tables_fold_layers_and_sort_by_time(self):
        lines = self.text.splitlines()
        start = lines.index("### dense decode, 1 rows, context 1024: the 12 slowest nodes (layers folded)")
        body = lines[start + 4:start + 8]
        self.assertTrue(body[0].startswith("| `lm_head` | matmul | 1 |"))
        self.assertTrue(body[1].startswith("| `model.layers.*.self_attn.o_proj` | matmul | 2 |"))
        self.assertIn("| 50.0% |", body[1])
        # A node the cost model has no cost for (a copy) has no rates.
        self.assertTrue(body[3].endswith("| 6.0 | — | — | — |"))

    def test_peer_failures_are_recorded_with_their_message(self):
        self.assertIn("| reduce-overhead | failed | — | — | RuntimeError: fixture \\| failure |", self.text)

    def test_matmul_ratio(self):
        self.assertIn("| decode | 1 | `model.layers.*.self_attn.o_proj` | 1 × 6144 × 16384 | bf16 | 50.0 | 40.0 | 1.25 |", self.text)

    def test_gemv_rows_give_the_share_of_the_copy_bandwidth(self):
        # No read ceiling in this shape (a sweep from before it): dashes.
        self.assertIn("| 64 | `model.layers.*.self_attn.o_proj` | 1 × 6144 × 16384 | 192.0 | 100.0 | 50.9% | — | — | 60.0 | 1.67 |", self.text)

    def test_gemv_rows_give_the_read_ceiling_and_glmcs_share_of_it(self):
        # A kernel that only reads wq_b's 16 MiB took 4.5 µs against glmc's 6.0 (75%); the
        # target is still judged against the copy bandwidth (70.4%, missed).
        section = self.text.split("## Decode GEMMs under issue 14's protocol")[1].split("\n## ")[0]
        self.assertIn("| read us | of read |", section)
        self.assertIn("| 8 | `model.layers.*.self_attn.indexer.wq_b+rope` | 1 × 4096 × 2048 | 16.0 | 6.0 | 70.4% | 4.5 | 75.0% | 5.0 | 1.20 |", section)
        self.assertIn("| 1 | `model.layers.*.self_attn.o_proj` | 1 × 6144 × 16384 | 192.0 | 55.0 | 91.5% | 50.6 | 92.0% | 60.0 | 0.92 |", section)

    def test_merge_writes_every_source(self):
        with tempfile.TemporaryDirectory() as tmp:
            out, merged = os.path.join(tmp, "R.md"), os.path.join(tmp, "all.json")
            render.main(["--out", out, "--merged", merged] + FIXTURES)
            self.assertEqual(open(out).read(), self.text)
            doc = json.load(open(merged))
            self.assertEqual(doc["schema"], "glmc-bench-merged/1")
            self.assertEqual(
                [s["tool"] for s in doc["sources"]],
                ["glmc", "transformers", "torch.matmul", "glmc GPU sweep, torch.matmul", "glmc GPU sweep, torch.matmul",
                 "glmc GPU test (absorbed attention)", "glmc GPU test (indexer)"],
            )

    def test_an_unknown_schema_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            bad = os.path.join(tmp, "bad.json")
            json.dump({"schema": "other/9"}, open(bad, "w"))
            with self.assertRaisesRegex(ValueError, "unknown schema 'other/9'"):
                render.load([bad])


if __name__ == "__main__":
    unittest.main()
