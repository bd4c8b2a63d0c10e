//! toolmux-mcp: under construction; see ARCHITECTURE.md for what it will hold.
