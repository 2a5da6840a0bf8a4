"""experiments.gpu_probes, run on the CPU: each probe prints what results/gpu/ keeps of it (CUDA's kernels say that
they are not available)."""


def test_the_sbm_profile_times_and_profiles_both_paths(here):
    out = here("experiments.gpu_probes", "sbm-profile", "--device", "cpu", "--sizes", "2x16x2x8").stdout
    timed = [line.split(":")[0] for line in out.splitlines() if line.startswith("== ")]
    assert timed == ["== B2 N16 H2x8 fast", "== B2 N16 H2x8 reference"] and out.count("Self CPU time total") == 2


def test_the_sdpa_probe_finds_no_gradient_past_either_form_of_mask_on_the_cpu(here):
    lines = here("experiments.gpu_probes", "sdpa-masks", "--device", "cpu").stdout.splitlines()
    probed = [line for line in lines if line.startswith("seed ")]
    assert len(probed) == 2 * 2 * 5  # seeds × mask forms × (SDPA's choice and each kernel)
    ran = [line for line in probed if "kernel None:" in line or "kernel SDPBackend.MATH:" in line]
    assert len(ran) == 8 and all(": leak 0 grad seen " in line for line in ran), ran


def test_a_bad_size_is_one_line(here):
    result = here("experiments.gpu_probes", "sbm-profile", "--sizes", "2x16", check=False)
    assert result.returncode == 2 and "--sizes: must be comma-separated BATCHxTOKENSxHEADSxHEAD_DIM" in result.stderr
