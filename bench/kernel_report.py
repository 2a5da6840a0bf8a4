"""kernel_report.md of the kernel pipeline (kernel_sparse.py): the paper's Tables 1-3 shape, Fig. 5, Fig. 6 and
the end-to-end fine-tuning, rendered from the pipeline's record (metrics.json's "kernel" entry)."""


def render(record: dict) -> str:
    """kernel_report.md: the Tables 1-3 shape, Fig. 5, Fig. 6 and the fine-tuning, generated from the record."""
    teacher = record["teacher"]
    lines = [f"Dense teacher: valid ppl {teacher['valid_ppl']:.3f}, test ppl {teacher['test_ppl']:.3f}.", "",
             "| kernels / loss | predictor train loss (Eq. 1 mean) | valid ppl | keys per query | density | "
             "core FLOPs × dense | attention FLOPs × dense | model FLOPs × dense | model time × dense | "
             "target recall | mass recall |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, v in record["variants"].items():
        lines.append(f"| {name} | {v['train_loss']:.4f} | {v['valid_ppl']:.3f} | {v['keys_per_query']:.1f} | "
                     f"{v['density']:.3f} | {v['core_flops_x_dense']:.3f} | {v['attention_flops_x_dense']:.3f} | "
                     f"{v['model_flops_x_dense']:.3f} | {v['time_x_dense']:.2f} | {v['target_recall']:.3f} | "
                     f"{v['mass_recall']:.3f} |")
    lines += ["", f"Fig. 5 ({record['config']['sweep']}):", "", "| select | value | valid ppl | keys per query | "
              "density | core FLOPs × dense | model time × dense |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {p['select']} | {p['value']} | {p['valid_ppl']:.3f} | {p['keys_per_query']:.1f} | {p['density']:.3f} | "
              f"{p['core_flops_x_dense']:.3f} | {p['time_x_dense']:.2f} |" for p in record["fig5"]]
    lines += ["", "Fig. 6 (sparsified from the last layer backwards):", "", "| layers sparsified | valid ppl | density |",
              "|---|---|---|"]
    lines += [f"| {p['layers']} | {p['valid_ppl']:.3f} | {p['density']:.3f} |" for p in record["fig6"]]
    f = record["finetune"]
    lines += ["", f"Fine-tuned end to end ({f['steps']} steps) at {f['setting']}: valid ppl {f['before_valid_ppl']:.3f} "
              f"→ {f['valid_ppl']:.3f}; test ppl {f['test_ppl']:.3f} = {f['ppl_x_teacher']:.3f} × teacher; core "
              f"FLOPs {f['core_flops_x_dense']:.3f} × dense (attention {f['attention_flops_x_dense']:.3f}, model "
              f"{f['model_flops_x_dense']:.3f}); model inference time {f['time_x_dense']:.2f} × dense (measured on one "
              f"validation batch); target (core ≤ {record['config']['flops_budget']} × dense, ppl ≤ 1.2 × teacher) "
              f"{'met' if f['target_met'] else 'not met'}."]
    if "dense_control" in f:
        lines += ["", f"Dense control (the teacher fine-tuned the same {f['steps']} steps with dense attention): test "
                      f"ppl {f['dense_control']['test_ppl']:.3f}; the sparse model's is {f['ppl_x_dense_control']:.3f} × "
                      f"the control's."]
    return "\n".join(lines) + "\n"
