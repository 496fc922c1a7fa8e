-- Projects' repositories, read by `runplane migrate` to report those the repository rule refuses.

-- name: project_repositories
SELECT id, account_id, repository_url FROM projects ORDER BY account_id, id;
