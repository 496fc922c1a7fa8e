"""What every part of runplane shares: the command and its composition root (``commands``), the
plumbing to outside systems (``adapters``), the vocabulary with nothing behind it (``basics``), a
run's lifecycle (``runs``), a dbt run's context (``dbt``), the forecast of demand (``demand``), the
named SQL (``sql``) and the generated contracts (``v1``)."""
