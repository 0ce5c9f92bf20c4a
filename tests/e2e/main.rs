//! End-to-end tests across processes: real `shopfloor engine` processes on a test database.

mod chaos;
mod engine_pool;
mod serve;
mod webhooks;
