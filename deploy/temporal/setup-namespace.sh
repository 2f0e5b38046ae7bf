#!/bin/sh
# One-shot (temporalio/admin-tools image): wait for the Temporal server, create the namespace
# if it is missing, and register promptjobs' custom search attributes. Safe to run again:
# an existing namespace is kept, and re-registering an attribute with its type is a no-op.
set -eu
: "${TEMPORAL_ADDRESS:=temporal:7233}"
: "${NAMESPACE:=default}"
: "${RETENTION:=7d}"

tries=0
until temporal operator cluster health --address "$TEMPORAL_ADDRESS" >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -ge 60 ]; then
        echo "Temporal at $TEMPORAL_ADDRESS is not healthy; giving up" >&2
        exit 1
    fi
    sleep 2
done

if ! temporal operator namespace describe --namespace "$NAMESPACE" \
        --address "$TEMPORAL_ADDRESS" >/dev/null 2>&1; then
    temporal operator namespace create --namespace "$NAMESPACE" --retention "$RETENTION" \
        --address "$TEMPORAL_ADDRESS"
fi

# workflows/search_attributes.py, name=type; tests/integration/test_compose.py keeps them in
# step. One attribute per command: the CLI registers only the first of several --name.
for attribute in \
    PromptJobState=Keyword \
    PromptJobOrg=Keyword \
    PromptJobPromptId=Keyword \
    PromptJobPriority=Int \
    PromptJobErrorKind=Keyword \
    PromptJobAttempt=Int
do
    tries=0
    # A namespace created a moment ago may not be known to every service yet: retry.
    until temporal operator search-attribute create --namespace "$NAMESPACE" \
            --name "${attribute%=*}" --type "${attribute#*=}" --address "$TEMPORAL_ADDRESS"; do
        tries=$((tries + 1))
        if [ "$tries" -ge 15 ]; then
            exit 1
        fi
        sleep 2
    done
done
echo "namespace $NAMESPACE is ready with promptjobs' search attributes"
