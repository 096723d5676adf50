//! One file per subcommand.

pub mod plan;
