//! Message sources. Each one turns outside input into control lines / inbound items and hands
//! them to the daemon through the [`intake::IntakeSink`] seam; none of them runs the agent or
//! imports the daemon.

pub mod commands;
pub mod fifo;
pub mod fifo_intake;
pub mod intake;
pub mod matrix;
pub mod telegram;
pub mod terminal;
