//! Message sources. Each one turns outside input into control lines / inbound items and hands
//! them to the daemon through the [`intake::IntakeSink`] seam; none of them runs the agent or
//! imports the daemon.

pub mod fifo;
pub mod intake;
pub mod telegram;
pub mod terminal;
