# End-to-end FSDP2 training (issue 11): from experiments/train_e2e.py's records.
FIGURES += out/train_e2e.png

out/train_e2e.png: fig_train_e2e.py ../experiments/results/train_e2e.jsonl
	$(PYTHON) fig_train_e2e.py $@ $(filter %.jsonl,$^)
