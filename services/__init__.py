"""The job services the API and the CLI share: the job actions, and the dispatcher that
hands them to Temporal."""
