//! Message sources. Each one turns outside input into control lines / inbound items for the
//! daemon's intake; none of them runs the agent.

pub mod fifo;
pub mod telegram;
pub mod terminal;
