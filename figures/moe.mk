# MoE expert parallelism (issue 14): from experiments/moe_ep.py's records.
FIGURES += out/moe.png

out/moe.png: fig_moe.py ../experiments/results/moe_ep.jsonl
	$(PYTHON) fig_moe.py $@ $(filter %.jsonl,$^)
