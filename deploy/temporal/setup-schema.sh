#!/bin/sh
# One-shot (temporalio/admin-tools image): create Temporal's two databases in the shared
# PostgreSQL and bring their schemas to the version this image ships. Safe to run again (a
# second `docker compose up`, a newer image): only a database created just now gets its
# version tables, and update-schema applies only the versions it lacks.
set -eu
: "${POSTGRES_SEEDS:=postgresql}"
: "${DB_PORT:=5432}"
: "${DBNAME:=temporal}"
: "${VISIBILITY_DBNAME:=temporal_visibility}"
# temporal-sql-tool reads the password from SQL_PASSWORD.
export SQL_PASSWORD="${POSTGRES_PWD}"

schema=/etc/temporal/schema/postgresql/v12
for pair in "$DBNAME:temporal" "$VISIBILITY_DBNAME:visibility"; do
    db="${pair%%:*}"
    dir="${pair#*:}"
    sql="temporal-sql-tool --plugin postgres12 --ep $POSTGRES_SEEDS -p $DB_PORT -u $POSTGRES_USER --db $db"
    # `create` fails when the database exists; a real error (a wrong password, say) then
    # fails update-schema, and the service with it.
    if $sql create; then
        $sql setup-schema -v 0.0
    else
        echo "database $db exists; updating its schema"
    fi
    $sql update-schema -d "$schema/$dir/versioned"
done
echo "Temporal schemas are up to date"
