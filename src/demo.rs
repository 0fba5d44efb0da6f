//! demo placeholder
