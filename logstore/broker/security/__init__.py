"""The broker's security: who is calling (:mod:`.principal`), how they proved it
(TLS client certificates, SCRAM sessions) and what they may do (ACLs, quotas).

DESIGN.md §6b. Every RPC handler asks :func:`.principal.principal_of` for the
caller; authentication only ever *produces* a principal, authorization only
ever *consumes* one.
"""
