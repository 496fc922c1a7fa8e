-- An environment's secret variables (DBT_ENV_SECRET_*): name -> Fernet ciphertext, never the value,
-- as jobs keep theirs in jobs.secret_environment. The plaintext ones that environments.variables
-- held until now are moved here by `runplane migrate` after this file (the key lives in the app).
ALTER TABLE environments ADD COLUMN secret_variables jsonb NOT NULL DEFAULT '{}'::jsonb;
