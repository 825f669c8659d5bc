"""Framework-neutral core: naming, filters, records, value encoding, stacks, the writer and the session.

Nothing here imports torch or MindSpore. Adapters turn framework objects into the plain records defined here;
the session decides what is collected; the writer is the only code that touches files.
"""
