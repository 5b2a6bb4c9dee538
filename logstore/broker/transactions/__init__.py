"""The transaction coordinator: producer ids, transactions and transaction groups."""
