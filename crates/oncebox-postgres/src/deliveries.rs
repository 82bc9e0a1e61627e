//! `DeliveryStore` on PostgreSQL (the relay's claims and the operator's verbs).
