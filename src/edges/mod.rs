//! What the outside world talks to: the daemon (`rollboard run`) and its wiring, the HTTP
//! API, the command line and signal handling. Nothing below this floor imports from here.

pub mod cli;
pub mod daemon;
pub mod http;
pub mod periods;
pub mod shutdown;
pub mod windows;
