"""What runs many trainings and reports on them: an experiment over seeds and the ratio grid
(``runner``), the tables and figures over their runs and seeds (``report``), Zoology's MQAR
sweep of vmapped trials (``mqar``), and child processes several at a time
(``processes``). It sits above the configs: it trains what configs/experiment.py names."""
