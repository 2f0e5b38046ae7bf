"""The SQL projection of jobs: models, migrations, the idempotent projector and read queries."""
