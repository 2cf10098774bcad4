"""Memory for assistants: facts (remember, dedupe, supersede), forgetting for real, context packs."""
