-- A local run's CPU, per account as its memory is: its weight against other runs (cgroup
-- cpu.weight, 1–10000, 100 an equal share) and a cap in CPUs (cpu.max). NULL: the operator's
-- runner.local_cpu_weight and runner.local_cpu_max.
ALTER TABLE accounts
    ADD COLUMN cpu_weight integer CHECK (cpu_weight BETWEEN 1 AND 10000),
    ADD COLUMN cpu_max    double precision CHECK (cpu_max > 0);
