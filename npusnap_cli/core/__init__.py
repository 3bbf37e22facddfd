"""The pipelines: checkpoint and restore as steps over an undo stack, process sets, recover, the guardian,
progress events. Below commands/, above backends/, platform/ and image/ (see the README's Layout)."""
